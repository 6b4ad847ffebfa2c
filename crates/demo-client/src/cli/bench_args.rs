//! `demo-client bench`'s arguments and their plan.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::bench::open_loop::Arrivals;
use crate::bench::step::StepPlan;
use crate::bench::system::{Model, System};
use crate::duration::parse_duration;

pub(super) const BENCH_ABOUT: &str = "\
The goodput benchmark. For each model (mmc: capacity 200 req/s; article: 300 req/s nominal)
and each load (a multiple of the capacity), every system gets one point, in an order rotated
from one load to the next: the system is started fresh (a demo-server on a free port of
127.0.0.1, and for `envoy` an Envoy with its adaptive concurrency filter in front of the
bare server), sent an open-loop load (arrivals at a fixed rate, never waiting for answers)
for the warm-up and then the recorded part without a pause, and stopped. A calibration
point (bare at 0.5x) comes first for each model: its served p99 is the unloaded one.

Per point: goodput (served requests a second), the p50 / p99 / p99.9 of the served requests
alone (from each request's scheduled instant), the shares rejected (429, 503, the stop
signal) and failed (timeouts, connection errors, other statuses). Envoy's `503`s count as
rejected only with its filter's body; its progress line also gives Envoy's own count of
the requests it blocked, which must agree. One progress line per point on stderr, the Markdown table on stdout; in --out, bench.csv and per model
bench-MODEL.svg (goodput and served p99 against the offered load, a line per system).
Under the table, per model and load of 3x or more: whether adaptive keeps 97 % of the
capacity, its served p99 within 1.5x the unloaded one, and any system with more goodput at an
equal or lower served p99. With --rounds N, every point is measured N times, the rounds of a
load one after the other: the table and the criteria give each system's medians, a second
table the lowest and highest of its rounds.

Systems: bare, full, adaptive, envoy, tower-shed, tower-resilience, little.

With --step, recovery after a step instead of the curve: per model, each system started
fresh gets 0.8x of the capacity for --phase, 3x for --phase and 0.8x again for --phase, one
open-loop load without a pause. Served answers are counted in 100 ms buckets of their answer
time; each phase's steady rate is the mean of its last --steady, and its time to converge the
first instant from which every --window-wide moving window stays within 5 % of it (`never`
when none comes before the steady part). Also the noise (the largest deviation of a window
inside the steady part) and, where it is over 5 %, the time to converge within it. The
table on stdout; in --out, step.csv (served rate per bucket), step-summary.csv and per model
step-MODEL.svg (served rate against time, a line per system).

Examples:
  demo-client bench                      # the whole curve (tens of minutes, estimated)
  demo-client bench --step --models mmc  # recovery after a step, 7 systems (about 3 minutes)
  demo-client bench --quick              # 1x, 3x and 10x, 2 s a point, not steady state
  demo-client bench --systems adaptive,envoy --models mmc --loads 3,10
  demo-client bench --models mmc --loads 3,10,100 --rounds 3  # medians of three rounds";

/// `demo-client bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// The systems, comma-separated [default: all seven].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub systems: Vec<System>,
    /// The latency models, comma-separated [default: mmc,article].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub models: Vec<Model>,
    /// The loads, multiples of the model's capacity, comma-separated [default:
    /// 1,1.5,3,10,100; with --quick 1,3,10].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub loads: Vec<f64>,
    /// The recorded part of each point [default: 6s; with --quick 2s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// The longest warm-up: each point sends its load, not recorded, until its served rate
    /// settles (three 2 s windows within 10 %), at most this long [default: 60s; with
    /// --quick 5s, too short to settle: its figures are not steady state].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// A short run: 1x, 3x and 10x, at most 5 s of warm-up and 2 s recorded a point, unless
    /// --loads, --warmup or --duration say otherwise.
    #[arg(long)]
    pub quick: bool,
    /// Each request's timeout, from its scheduled instant: a request unanswered by then
    /// failed. Above zero.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The generator's cap on requests in flight: an arrival over it is not sent, counted
    /// as dropped, and its point marked as limited by the generator.
    #[arg(long, value_name = "N", default_value_t = NonZeroUsize::new(4096).expect("not zero"))]
    pub max_in_flight: NonZeroUsize,
    /// Space arrivals as a Poisson process (seeded by --seed) instead of evenly.
    #[arg(long)]
    pub poisson: bool,
    /// The seed of --poisson's arrivals.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Leave out the calibration points (bare at 0.5x, one per model and round).
    #[arg(long)]
    pub no_calibration: bool,
    /// Rounds of every point, each round measuring every system once in a rotated order;
    /// with more than one, the table gives each system's medians over its rounds, a second
    /// table how far the rounds spread, and the criteria judge the medians. Odd counts give
    /// a true middle round.
    #[arg(long, value_name = "N", default_value_t = NonZeroUsize::MIN)]
    pub rounds: NonZeroUsize,
    /// Recovery after a step instead of the curve: 0.8x, 3x, 0.8x of the capacity, each
    /// for --phase, per system and model; the time each phase takes to converge.
    #[arg(long, conflicts_with_all = ["loads", "duration", "warmup", "quick", "no_calibration", "rounds"])]
    pub step: bool,
    /// With --step: the length of each phase, a multiple of 100 ms [default: 8s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "step")]
    pub phase: Option<Duration>,
    /// With --step: the width of the moving window that must stay within 5 % of the steady
    /// rate, a multiple of 100 ms [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "step")]
    pub window: Option<Duration>,
    /// With --step: the last part of each phase whose mean served rate is its steady rate,
    /// a multiple of 100 ms [default: 3s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "step")]
    pub steady: Option<Duration>,
    /// The demo-server executable [default: next to demo-client].
    #[arg(long = "server-bin", value_name = "PATH")]
    pub server_bin: Option<PathBuf>,
    /// The `envoy` executable [default: ENVOY, else .venv/bin/envoy in this directory or a
    /// parent, else envoy on the PATH]; needed only for the `envoy` system.
    #[arg(long, value_name = "PATH")]
    pub envoy: Option<PathBuf>,
    /// Directory for bench.csv, the plots bench-MODEL.svg, and Envoy's configuration and
    /// log (in envoy/).
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
}

/// The highest load `demo-client bench` accepts: 1 000 times the capacity (300 000 req/s on
/// article), ten times the curve's highest; more would keep the generator counting drops
/// for hours.
pub const MAX_LOAD: f64 = 1_000.0;

/// The selection and timing of a `demo-client bench` run, defaults and --quick applied.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchPlan {
    /// The systems, in the order of the first round.
    pub systems: Vec<System>,
    /// The models.
    pub models: Vec<Model>,
    /// The loads.
    pub loads: Vec<f64>,
    /// The longest warm-up of each point.
    pub warmup: Duration,
    /// The recorded part of each point.
    pub duration: Duration,
    /// Rounds of every point (at least one).
    pub rounds: usize,
}

impl BenchArgs {
    /// The run's selection and timing: what was given, else the defaults (or --quick's).
    ///
    /// # Errors
    ///
    /// A load that is not a finite number above zero and at most [`MAX_LOAD`], or a zero
    /// duration or timeout.
    pub fn plan(&self) -> Result<BenchPlan, String> {
        let or = |given: &[f64], full: &[f64], quick: &[f64]| {
            if !given.is_empty() {
                given.to_vec()
            } else if self.quick {
                quick.to_vec()
            } else {
                full.to_vec()
            }
        };
        let loads = or(
            &self.loads,
            &[1.0, 1.5, 3.0, 10.0, 100.0],
            &[1.0, 3.0, 10.0],
        );
        if let Some(bad) = loads.iter().find(|l| !(l.is_finite() && **l > 0.0)) {
            return Err(format!(
                "--loads: a load must be a finite number above zero, got {bad}"
            ));
        }
        if let Some(bad) = loads.iter().find(|l| **l > MAX_LOAD) {
            return Err(format!(
                "--loads: a load must be at most {MAX_LOAD} (x the capacity), got {bad}"
            ));
        }
        if self.timeout.is_zero() {
            return Err("--timeout must be above zero".to_owned());
        }
        let pick = |given: Option<Duration>, full: u64, quick: u64| {
            given.unwrap_or(Duration::from_millis(if self.quick { quick } else { full }))
        };
        let duration = pick(self.duration, 6_000, 2_000);
        if duration.is_zero() {
            return Err("--duration must be above zero".to_owned());
        }
        Ok(BenchPlan {
            systems: if self.systems.is_empty() {
                System::ALL.to_vec()
            } else {
                self.systems.clone()
            },
            models: if self.models.is_empty() {
                Model::ALL.to_vec()
            } else {
                self.models.clone()
            },
            loads,
            warmup: pick(self.warmup, 60_000, 5_000),
            duration,
            rounds: self.rounds.get(),
        })
    }

    /// The phases of `--step` and how convergence is judged: what was given, else the
    /// defaults of [`StepPlan::default`].
    ///
    /// # Errors
    ///
    /// The rules of [`StepPlan::new`].
    pub fn step_plan(&self) -> Result<StepPlan, String> {
        let default = StepPlan::default();
        StepPlan::new(
            self.phase.unwrap_or(default.phase()),
            self.window.unwrap_or(default.window()),
            self.steady.unwrap_or(default.steady()),
        )
    }

    /// How arrivals are spaced: evenly, or `--poisson` with `--seed`.
    pub fn arrivals(&self) -> Arrivals {
        if self.poisson {
            Arrivals::Poisson { seed: self.seed }
        } else {
            Arrivals::Fixed
        }
    }
}
