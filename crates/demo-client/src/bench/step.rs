//! Recovery after a step (`demo-client bench --step`): the open-loop load steps from 0.8x of
//! the model's capacity to 3x and back, each served answer is counted in the 100 ms bucket
//! of its answer time, and each phase's time to converge is read from the buckets.
//!
//! # Convergence
//!
//! A phase's *steady value* is its mean served rate over its last part ([`StepPlan::steady`],
//! 3 s by default). Its *time to converge* is the first instant `t` after the phase's start
//! from which every window of [`StepPlan::window`] (1 s by default) that starts at `t` or
//! later, and ends within the phase, has a mean served rate within [`BAND`] (5 %) of the
//! steady value. When no such instant comes before the steady part starts, the phase never
//! converged (its own last part was not steady).
//!
//! # Resolution
//!
//! The instant is a multiple of [`BUCKET`] (100 ms), but that is not the resolution: a
//! window of `w` hides a deviation of `d` (as a share of the steady value) that lasts less
//! than `0.05 w / d` (a total outage of 50 ms in a 1 s window, a 20 % dip of 250 ms), and the
//! served rate of a window is itself noisy: at 200 req/s a 1 s window holds about 200 answers,
//! and a saturated M/M/10 server's answers are a Poisson process, so the window's rate varies
//! by about 1/sqrt(200) = 7 % from one window to the next with no change in the system. So
//! each phase also reports its *noise* (the largest deviation of a window inside its steady
//! part) and the time to converge within that noise when it is above 5 %: "no further from
//! its steady value than it is when steady".

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::BoxError;

use super::open_loop::{Arrivals, LATE_AFTER, Schedule};
use super::outcome::Outcome;
use super::runner::BenchConfig;
use super::send::HttpSender;
use super::system::{Model, Running, System};

/// The width of a bucket of answer times: 100 ms.
pub const BUCKET: Duration = Duration::from_millis(100);

/// How close to its steady value a window's served rate must be: 5 %.
pub const BAND: f64 = 0.05;

/// The load of the first and last phases, as a multiple of the capacity: 0.8.
pub const LOW: f64 = 0.8;

/// The load of the middle phase, as a multiple of the capacity: 3.
pub const HIGH: f64 = 3.0;

/// The phases of a step run and how convergence is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepPlan {
    phase: Duration,
    window: Duration,
    steady: Duration,
}

impl Default for StepPlan {
    /// Phases of 8 s, a window of 1 s, a steady part of 3 s.
    fn default() -> Self {
        Self {
            phase: Duration::from_secs(8),
            window: Duration::from_secs(1),
            steady: Duration::from_secs(3),
        }
    }
}

impl StepPlan {
    /// Each phase lasts `phase`; windows of `window`; the steady value from each phase's
    /// last `steady`.
    ///
    /// # Errors
    ///
    /// When a duration is not a multiple of [`BUCKET`] (100 ms), `window` is zero or longer
    /// than `steady`, or `steady` is not shorter than `phase`; the message names the rule.
    pub fn new(phase: Duration, window: Duration, steady: Duration) -> Result<Self, String> {
        for (name, d) in [("phase", phase), ("window", window), ("steady", steady)] {
            if d.as_nanos() % BUCKET.as_nanos() != 0 {
                return Err(format!(
                    "--{name} must be a multiple of 100 ms, got {}",
                    fmt_ms(d)
                ));
            }
        }
        if window.is_zero() || window > steady {
            return Err(format!(
                "--window must be above zero and at most --steady ({}), got {}",
                fmt_ms(steady),
                fmt_ms(window)
            ));
        }
        if steady >= phase {
            return Err(format!(
                "--steady must be shorter than --phase ({}), got {}",
                fmt_ms(phase),
                fmt_ms(steady)
            ));
        }
        Ok(Self {
            phase,
            window,
            steady,
        })
    }

    /// The length of each of the three phases. Default is 8 seconds.
    pub fn phase(&self) -> Duration {
        self.phase
    }

    /// The width of the moving window. Default is 1 second.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The last part of each phase whose mean is its steady value. Default is 3 seconds.
    pub fn steady(&self) -> Duration {
        self.steady
    }

    /// The loads of the three phases, multiples of the capacity: 0.8, 3, 0.8.
    pub const fn loads(&self) -> [f64; 3] {
        [LOW, HIGH, LOW]
    }
}

fn buckets(d: Duration) -> usize {
    (d.as_nanos() / BUCKET.as_nanos()) as usize
}

fn fmt_ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Served answers per [`BUCKET`] of answer time from the start of the load, and the counts
/// of the other outcomes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    served: Vec<u64>,
    rejected: u64,
    failed: u64,
    dropped: u64,
    late: u64,
}

impl Timeline {
    /// A timeline of served counts per bucket, nothing else counted (for tests and replays).
    pub fn from_counts(served: Vec<u64>) -> Self {
        Self {
            served,
            ..Self::default()
        }
    }

    fn serve_at(&mut self, since_start: Duration) {
        let k = buckets(since_start);
        if self.served.len() <= k {
            self.served.resize(k + 1, 0);
        }
        self.served[k] += 1;
    }

    /// Served answers in each bucket (answers after the last phase included).
    pub fn served(&self) -> &[u64] {
        &self.served
    }

    /// Requests rejected.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Requests failed.
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// Arrivals not sent: the generator's in-flight cap was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Requests sent more than [`LATE_AFTER`] after their scheduled instant.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// The served rate (requests a second) of buckets `from..to`, missing buckets as zero.
    fn rate(&self, from: usize, to: usize) -> f64 {
        let n = to.saturating_sub(from);
        if n == 0 {
            return 0.0;
        }
        let sum: u64 = (from..to)
            .map(|k| self.served.get(k).copied().unwrap_or(0))
            .sum();
        sum as f64 / (n as f64 * BUCKET.as_secs_f64())
    }

    /// The served rate of each bucket from `from` to `to` averaged over the `window` that
    /// starts at it (as the convergence reads it), requests a second.
    pub fn windowed(&self, window: Duration, to: Duration) -> Vec<f64> {
        let (w, end) = (buckets(window).max(1), buckets(to));
        (0..=end.saturating_sub(w))
            .map(|k| self.rate(k, k + w))
            .collect()
    }
}

/// How one phase converged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseFigures {
    /// The phase's load, a multiple of the capacity.
    pub load: f64,
    /// The mean served rate of the phase's steady part, requests a second.
    pub steady: f64,
    /// The largest deviation from `steady` of a window inside the steady part, as a share
    /// of `steady` (0 when `steady` is 0).
    pub noise: f64,
    /// The time from the phase's start to convergence within [`BAND`]; `None`: never.
    pub converged: Option<Duration>,
    /// The time to converge within the larger of [`BAND`] and `noise`.
    pub converged_within_noise: Option<Duration>,
}

/// The first bucket of `counts` (one phase) from which every window of `window` buckets
/// that ends within the phase has a mean within `band` (a share) of `steady` (a mean per
/// bucket); `None` when that bucket is not before `last_start` (the steady part's first).
///
/// Pure: the buckets are the phase's, from its start.
pub fn converged_at(
    counts: &[u64],
    window: usize,
    steady: f64,
    band: f64,
    last_start: usize,
) -> Option<usize> {
    let window = window.max(1);
    if counts.len() < window {
        return None;
    }
    let within = |k: usize| {
        let mean = counts[k..k + window].iter().sum::<u64>() as f64 / window as f64;
        // NOTE: `<=` with a tolerance, so that a window exactly at the band's edge (integer
        // counts make that common) is within it, whatever the float rounding.
        (mean - steady).abs() <= band * steady + 1e-9
    };
    // Walk back from the last window: the answer is one past the last window outside.
    let last = counts.len() - window;
    let first_of_run = (0..=last).rev().find(|&k| !within(k)).map_or(0, |k| k + 1);
    (first_of_run <= last && first_of_run <= last_start).then_some(first_of_run)
}

/// The figures of the phase of `timeline` that starts at bucket `from` and lasts `plan`'s
/// phase, at `load`.
pub fn phase_figures(timeline: &Timeline, from: usize, plan: &StepPlan, load: f64) -> PhaseFigures {
    let len = buckets(plan.phase);
    let counts: Vec<u64> = (from..from + len)
        .map(|k| timeline.served.get(k).copied().unwrap_or(0))
        .collect();
    let (window, steady_len) = (buckets(plan.window), buckets(plan.steady));
    let steady_start = len - steady_len;
    let steady_mean = counts[steady_start..].iter().sum::<u64>() as f64 / steady_len as f64;
    let noise = if steady_mean > 0.0 {
        (steady_start..=len - window)
            .map(|k| {
                let mean = counts[k..k + window].iter().sum::<u64>() as f64 / window as f64;
                (mean - steady_mean).abs() / steady_mean
            })
            .fold(0.0, f64::max)
    } else {
        0.0
    };
    let at = |band| {
        converged_at(&counts, window, steady_mean, band, steady_start)
            .map(|k| BUCKET * u32::try_from(k).unwrap_or(u32::MAX))
    };
    PhaseFigures {
        load,
        steady: steady_mean / BUCKET.as_secs_f64(),
        noise,
        converged: at(BAND),
        converged_within_noise: at(BAND.max(noise)),
    }
}

/// Sends the load of `schedules` one after the other, each for `phase`, without a pause
/// between them: arrivals at their scheduled instants whatever the answers, at most
/// `max_in_flight` at once (an arrival over the cap is dropped), and counts each served
/// answer in the [`BUCKET`] of its answer time. Returns when every request has ended.
pub async fn run_phases<F, Fut>(
    schedules: &[Schedule],
    phase: Duration,
    max_in_flight: usize,
    mut send: F,
) -> Timeline
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let offsets = schedules.iter().enumerate().flat_map(|(i, schedule)| {
        let from = phase * u32::try_from(i).unwrap_or(u32::MAX);
        schedule.offsets(phase).map(move |o| from + o)
    });
    for offset in offsets {
        let scheduled = start + offset;
        tokio::time::sleep_until(scheduled).await;
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            timeline.lock().expect("not poisoned").dropped += 1;
            continue;
        };
        let request = send();
        let timeline = Arc::clone(&timeline);
        tasks.spawn(async move {
            // NOTE: the request starts at the task's first poll, not when the loop spawned
            // it: the generator's lag is measured where it happens.
            let late = Instant::now().saturating_duration_since(scheduled) > LATE_AFTER;
            let outcome = request.await;
            let answered = Instant::now().duration_since(start);
            drop(permit);
            let mut timeline = timeline.lock().expect("not poisoned");
            if late {
                timeline.late += 1;
            }
            match outcome {
                Outcome::Served => timeline.serve_at(answered),
                Outcome::Rejected => timeline.rejected += 1,
                Outcome::Failed => timeline.failed += 1,
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let timeline = timeline.lock().expect("not poisoned");
    timeline.clone()
}

/// One system's step run: its timeline and the figures of its three phases.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRun {
    /// The system.
    pub system: System,
    /// The model.
    pub model: Model,
    /// Served answers per bucket, and the other counts.
    pub timeline: Timeline,
    /// The start (0.8x from a fresh system), the step up (3x) and the step down (0.8x).
    pub phases: [PhaseFigures; 3],
}

impl StepRun {
    /// The figures of `timeline` under `plan`.
    pub fn of(system: System, model: Model, timeline: Timeline, plan: &StepPlan) -> Self {
        let len = buckets(plan.phase);
        let loads = plan.loads();
        let phases = [0, 1, 2].map(|i| phase_figures(&timeline, i * len, plan, loads[i]));
        Self {
            system,
            model,
            timeline,
            phases,
        }
    }

    /// Whether the generator limited the run: an arrival dropped, or more than 2 % late.
    pub fn generator_limited(&self) -> bool {
        let t = &self.timeline;
        let sent = t.served.iter().sum::<u64>() + t.rejected + t.failed;
        t.dropped > 0 || (sent > 0 && t.late as f64 / sent as f64 > 0.02)
    }
}

/// Runs one system's step: started fresh, the three phases without a pause, stopped.
///
/// `config`'s programs, directory, timeout, in-flight cap and arrivals are used; its
/// warm-up and duration are not (the first phase is the warm-up, and is measured too).
///
/// # Errors
///
/// When the system cannot start or stop.
pub async fn run_step(
    config: &BenchConfig,
    plan: &StepPlan,
    system: System,
    model: Model,
) -> Result<StepRun, BoxError> {
    let schedules = plan
        .loads()
        .iter()
        .enumerate()
        .map(|(i, load)| {
            // NOTE: each phase its own Poisson stream, so the two 0.8x phases differ.
            let arrivals = match config.arrivals {
                Arrivals::Poisson { seed } => Arrivals::Poisson {
                    seed: seed.wrapping_add(i as u64),
                },
                fixed => fixed,
            };
            Schedule::new(model.capacity() * load, arrivals)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let running = Running::start(system, model, &config.programs, &config.dir).await?;
    let sender = HttpSender::new(running.url().clone(), config.timeout);
    let timeline = run_phases(&schedules, plan.phase, config.max_in_flight, || {
        sender.send()
    })
    .await;
    running.stop().await?;
    Ok(StepRun::of(system, model, timeline, plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(phase_ms: u64, window_ms: u64, steady_ms: u64) -> StepPlan {
        StepPlan::new(
            Duration::from_millis(phase_ms),
            Duration::from_millis(window_ms),
            Duration::from_millis(steady_ms),
        )
        .unwrap()
    }

    /// A phase of 8 s (80 buckets) whose first `k` buckets serve `before` and the rest 20.
    fn stepped(k: usize, before: u64) -> Vec<u64> {
        (0..80).map(|i| if i < k { before } else { 20 }).collect()
    }

    #[test]
    fn a_step_that_settles_after_k_buckets_converges_after_k_times_100_ms() {
        let p = plan(8_000, 1_000, 3_000);
        for (k, before) in [(7, 0), (13, 60), (1, 0), (30, 5)] {
            let timeline = Timeline::from_counts(stepped(k, before));
            let f = phase_figures(&timeline, 0, &p, 3.0);
            assert!((f.steady - 200.0).abs() < 1e-9, "{f:?}");
            assert!(f.noise.abs() < 1e-12, "{f:?}");
            assert_eq!(
                f.converged,
                Some(BUCKET * k as u32),
                "k = {k}, before = {before}"
            );
            assert_eq!(f.converged_within_noise, f.converged);
        }
        // Settled from the first bucket: 0.
        let flat = phase_figures(&Timeline::from_counts(vec![20; 80]), 0, &p, 0.8);
        assert_eq!(flat.converged, Some(Duration::ZERO));
    }

    #[test]
    fn noise_within_the_band_does_not_delay_convergence() {
        let p = plan(8_000, 1_000, 3_000);
        // After 10 empty buckets, buckets of 19 and 21 (5 % either way) in turn, and a
        // bucket of 22 (10 %) alone now and then: every 1 s window is within 5 % of 20.
        let counts: Vec<u64> = (0..80)
            .map(|i| match i {
                0..10 => 0,
                _ if i % 17 == 0 => 22,
                _ if i % 2 == 0 => 19,
                _ => 21,
            })
            .collect();
        let f = phase_figures(&Timeline::from_counts(counts), 0, &p, 3.0);
        assert!((f.steady - 200.0).abs() < 5.0, "{f:?}");
        assert!(f.noise > 0.0 && f.noise <= BAND, "{f:?}");
        assert_eq!(f.converged, Some(Duration::from_secs(1)), "{f:?}");
    }

    #[test]
    fn a_phase_that_never_settles_is_never_and_keeps_its_figures() {
        let p = plan(8_000, 1_000, 3_000);
        // A sawtooth of 2 s: 10 buckets of 30, 10 of 10, all phase long.
        let counts: Vec<u64> = (0..80)
            .map(|i| if (i / 10) % 2 == 0 { 30 } else { 10 })
            .collect();
        let f = phase_figures(&Timeline::from_counts(counts), 0, &p, 3.0);
        assert_eq!(f.converged, None, "{f:?}");
        // Steady: the last 30 buckets, 10 of 10, 10 of 30, 10 of 10: mean 50/3 a bucket.
        assert!((f.steady - 500.0 / 3.0).abs() < 1e-6, "{f:?}");
        assert!(f.noise > 0.25, "{f:?}");
        // Within its own (large) noise it is "converged" from the first window on.
        assert_eq!(f.converged_within_noise, Some(Duration::ZERO), "{f:?}");

        // Still moving at the start of the steady part (a slow ramp): never.
        let ramp: Vec<u64> = (0..80).map(|i| (i as u64).min(60)).collect();
        let f = phase_figures(&Timeline::from_counts(ramp), 0, &p, 3.0);
        assert_eq!(f.converged, None, "{f:?}");
    }

    #[test]
    fn phases_are_read_from_their_own_buckets() {
        let p = plan(2_000, 500, 1_000);
        // 20 buckets a phase: 16, then 40 after 3 buckets at 10, then 16 after 6 at 40.
        let mut counts = vec![16; 20];
        counts.extend((0..20).map(|i| if i < 3 { 10 } else { 40 }));
        counts.extend((0..20).map(|i| if i < 6 { 40 } else { 16 }));
        // Answers after the end of the load do not count.
        counts.extend([99, 99]);
        let run = StepRun::of(System::Bare, Model::Mmc, Timeline::from_counts(counts), &p);
        let [start, up, down] = run.phases;
        assert!(
            [(start.load, LOW), (up.load, HIGH), (down.load, LOW)]
                .iter()
                .all(|(a, b)| (a - b).abs() < 1e-12),
            "{run:?}"
        );
        assert!((up.steady - 400.0).abs() < 1e-9 && (down.steady - 160.0).abs() < 1e-9);
        assert_eq!(start.converged, Some(Duration::ZERO));
        assert_eq!(up.converged, Some(Duration::from_millis(300)));
        assert_eq!(down.converged, Some(Duration::from_millis(600)));
    }

    #[test]
    fn plans_that_cannot_be_judged_are_refused() {
        let ms = Duration::from_millis;
        assert_eq!(
            StepPlan::new(ms(8_000), ms(1_050), ms(3_000)).unwrap_err(),
            "--window must be a multiple of 100 ms, got 1050 ms"
        );
        assert_eq!(
            StepPlan::new(ms(8_000), ms(4_000), ms(3_000)).unwrap_err(),
            "--window must be above zero and at most --steady (3000 ms), got 4000 ms"
        );
        assert_eq!(
            StepPlan::new(ms(3_000), ms(1_000), ms(3_000)).unwrap_err(),
            "--steady must be shorter than --phase (3000 ms), got 3000 ms"
        );
        let default = StepPlan::default();
        assert_eq!(
            StepPlan::new(default.phase(), default.window(), default.steady()),
            Ok(default)
        );
    }

    /// Paused time: a system that serves at most 150 a second (a semaphore of 3 permits
    /// held 20 ms each) under 0.8x, 3x and 0.8x of 100 a second: 80, then 150, then 80 a
    /// second, each answer counted in the bucket of its answer time.
    #[tokio::test(start_paused = true)]
    async fn the_phases_run_back_to_back_and_answers_land_in_their_buckets() {
        let schedules: Vec<Schedule> = [0.8, 3.0, 0.8]
            .map(|l| Schedule::new(100.0 * l, Arrivals::Fixed).unwrap())
            .to_vec();
        let server = Arc::new(Semaphore::new(3));
        let timeline = run_phases(&schedules, Duration::from_secs(2), 1000, || {
            let server = Arc::clone(&server);
            async move {
                match server.try_acquire_owned() {
                    Ok(_held) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Outcome::Served
                    }
                    Err(_) => Outcome::Rejected,
                }
            }
        })
        .await;
        let run = StepRun::of(System::Bare, Model::Mmc, timeline, &plan(2_000, 500, 1_000));
        let [start, up, down] = run.phases;
        assert!((start.steady - 80.0).abs() < 1e-9, "{start:?}");
        assert!((down.steady - 80.0).abs() < 1e-9, "{down:?}");
        assert!((100.0..=150.0).contains(&up.steady), "{up:?}");
        assert!(run.timeline.rejected() > 0, "3x over 150 a second sheds");
        assert_eq!(run.timeline.failed() + run.timeline.dropped(), 0);
        assert!(!run.generator_limited());
        assert!(
            up.converged.is_some() && down.converged.is_some(),
            "{run:?}"
        );
    }
}
