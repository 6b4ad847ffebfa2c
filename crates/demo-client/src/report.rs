//! The figures of one outage run, computed from its per-second series.
//!
//! A run is laid out in whole seconds: `[0, pause_at)` is the steady state, `[pause_at,
//! resume_at)` the pause, `[resume_at, end)` the observation after resume. All figures are
//! computed at 1-second resolution:
//!
//! - **baseline**: mean successful requests per second over the steady state, leaving out
//!   its first third (at least one second) as warm-up, while the clients' first think times
//!   are still spreading out;
//! - **recovery time**: seconds from resume to the first second from which the server is
//!   healthy and stays healthy until the end of the observation. That second `r` must be
//!   healthy on its own (successes at least [`RecoveryCriteria::ok_fraction`] of baseline,
//!   timeouts under [`RecoveryCriteria::timeout_fraction`] of baseline), and so must every
//!   window of [`RecoveryCriteria::window`] seconds that starts at `r` or later and ends within
//!   the observation, judged on its means. The window (10 s, or half the observation when
//!   that is shorter: [`RecoveryCriteria::for_phases`]) keeps Poisson noise
//!   from deciding whether the server "stays" up: at 100 requests per second one second in
//!   seven falls under 90% of the mean by chance alone, a 10-second mean almost never does;
//!   judging `r` alone keeps the resolution at one second;
//! - **amplification**: attempts sent during the pause divided by (baseline x pause length):
//!   1.0 means the clients sent what they would have sent anyway, 3.0 means they tripled it;
//! - **peak server concurrency** after resume, when the server's concurrency was sampled;
//! - **failed**: the requests of the whole run that did not succeed: those that ended in a
//!   failure (an error status, a stop signal, a retry the budget refused, a refused
//!   connection, a last attempt that timed out) and those still waiting for an outcome when
//!   the run ended; with their share of all the requests the clients started;
//! - **throttled**: the requests of the whole run that the client-side throttle refused
//!   (never sent; part of **failed**);
//! - **p50 / p99 latency** of the requests that succeeded after resume;
//! - **p99 time to outcome** of every request that ended after resume, failures included,
//!   and of those still waiting at the end (counted until the end, a lower bound): what a
//!   caller waited, whatever it got.

use std::fmt;
use std::time::Duration;

use crate::record::Second;

/// Where the pause falls in a run, in whole seconds from the start of the recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phases {
    /// The second the pause starts (the length of the steady state).
    pub pause_at: usize,
    /// The length of the pause in seconds.
    pub pause_for: usize,
    /// How many seconds are observed after resume.
    pub observe_for: usize,
}

impl Phases {
    /// The second the server is resumed.
    pub const fn resume_at(&self) -> usize {
        self.pause_at + self.pause_for
    }

    /// The end of the observation (exclusive): the number of seconds in the run.
    pub const fn end(&self) -> usize {
        self.resume_at() + self.observe_for
    }

    /// The name of the phase second `s` falls into: `steady`, `paused` or `resumed`.
    pub const fn phase_of(&self, s: usize) -> &'static str {
        if s < self.pause_at {
            "steady"
        } else if s < self.resume_at() {
            "paused"
        } else {
            "resumed"
        }
    }
}

/// The thresholds that decide when a server counts as recovered. See the [module
/// docs](self).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecoveryCriteria {
    /// Successes per second must reach this share of baseline. Default is 0.9 (the issue's
    /// "90% of baseline").
    pub ok_fraction: f64,
    /// Timeouts per second must stay under this share of baseline. Default is 0.01 (the
    /// issue's "timeouts < 1% of baseline").
    pub timeout_fraction: f64,
    /// The number of seconds averaged when judging whether the server stays healthy.
    /// Default is 10, so that the noise of a Poisson arrival process at 100 requests per
    /// second does not decide (see [`RecoveryCriteria::for_phases`] for short runs).
    pub window: usize,
}

impl RecoveryCriteria {
    /// The default criteria, with the window shortened to half the observation when the
    /// observation is shorter than two windows (a `--quick` run observes 10 s and judges on
    /// 5-second windows), so that a recovery after the first second can still be seen.
    pub fn for_phases(phases: Phases) -> Self {
        let default = Self::default();
        Self {
            window: default.window.min(phases.observe_for / 2).max(1),
            ..default
        }
    }
}

impl Default for RecoveryCriteria {
    fn default() -> Self {
        Self {
            ok_fraction: 0.9,
            timeout_fraction: 0.01,
            window: 10,
        }
    }
}

/// The figures of one run. See the [module docs](self) for how each is computed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// A label for the run, such as `fixed vs --stack none`.
    pub label: String,
    /// Mean successful requests per second in the steady state.
    pub baseline: f64,
    /// Seconds from resume until the server was healthy for good; `None` if it never was
    /// within the observation.
    pub recovery: Option<usize>,
    /// Attempts during the pause over (baseline x pause length); `None` if the baseline is 0.
    pub amplification: Option<f64>,
    /// Attempts sent during the pause.
    pub attempts_during_pause: u64,
    /// Highest server concurrency sampled after resume.
    pub peak_concurrency: Option<u64>,
    /// Median latency of the requests that succeeded after resume.
    pub p50: Option<Duration>,
    /// 99th percentile latency of the requests that succeeded after resume.
    pub p99: Option<Duration>,
    /// Requests the clients started during the whole run.
    pub requests: u64,
    /// Requests of the whole run that did not succeed: ended in a failure, or still waiting
    /// at the end ([`unfinished`](Self::unfinished)).
    pub failed: u64,
    /// Requests still waiting for an outcome when the run ended.
    pub unfinished: u64,
    /// Requests of the whole run the client-side throttle refused (part of
    /// [`failed`](Self::failed)).
    pub throttled: u64,
    /// 99th percentile time to outcome of the requests that ended after resume (successes
    /// and failures) and of those still waiting at the end.
    pub p99_outcome: Option<Duration>,
    /// Totals over the observation after resume.
    pub after_resume: Second,
}

impl RunReport {
    /// Computes the figures of `series` (one row per second from the start of the run;
    /// missing seconds count as empty) and `unfinished` (how long each request still waiting
    /// at the end had waited) with [`RecoveryCriteria::for_phases`].
    pub fn compute(
        label: impl Into<String>,
        series: &[Second],
        unfinished: &[Duration],
        phases: Phases,
    ) -> Self {
        Self::compute_with(
            label,
            series,
            unfinished,
            phases,
            RecoveryCriteria::for_phases(phases),
        )
    }

    /// Computes the figures of `series` and `unfinished` with the given criteria.
    pub fn compute_with(
        label: impl Into<String>,
        series: &[Second],
        unfinished: &[Duration],
        phases: Phases,
        criteria: RecoveryCriteria,
    ) -> Self {
        let empty = Second::default();
        let row = |s: usize| series.get(s).unwrap_or(&empty);

        let baseline = baseline(series, phases);
        let recovery = recovery_time(series, phases, baseline, criteria);

        let attempts_during_pause: u64 = (phases.pause_at..phases.resume_at())
            .map(|s| row(s).attempts)
            .sum();
        let expected = baseline * phases.pause_for as f64;
        let amplification = (expected > 0.0).then(|| attempts_during_pause as f64 / expected);

        let mut after_resume = Second::default();
        for s in phases.resume_at()..phases.end() {
            after_resume.merge(row(s));
        }
        let mut latencies = std::mem::take(&mut after_resume.latencies);
        latencies.sort_unstable();
        let p50 = percentile(&latencies, 0.50);
        let p99 = percentile(&latencies, 0.99);
        let mut outcomes: Vec<Duration> = latencies
            .iter()
            .chain(&after_resume.failure_latencies)
            .chain(unfinished)
            .copied()
            .collect();
        outcomes.sort_unstable();
        let p99_outcome = percentile(&outcomes, 0.99);
        after_resume.latencies = latencies;

        let (requests, ended_failed, throttled) =
            (0..phases.end()).map(row).fold((0, 0, 0), |(r, f, t), s| {
                (r + s.requests, f + s.failed, t + s.throttled)
            });
        let unfinished_count = unfinished.len() as u64;

        Self {
            label: label.into(),
            baseline,
            recovery,
            amplification,
            attempts_during_pause,
            peak_concurrency: after_resume.server_concurrency,
            p50,
            p99,
            requests,
            failed: ended_failed + unfinished_count,
            unfinished: unfinished_count,
            throttled,
            p99_outcome,
            after_resume,
        }
    }

    /// [`failed`](Self::failed) as a share of [`requests`](Self::requests); `None` without
    /// requests.
    pub fn failed_share(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.failed as f64 / self.requests as f64)
    }

    /// Whether the server recovered within the observation.
    pub fn recovered(&self) -> bool {
        self.recovery.is_some()
    }
}

/// Mean successes per second over the steady state minus its first third (at least one
/// second of warm-up is left out when the steady state has two seconds or more).
pub fn baseline(series: &[Second], phases: Phases) -> f64 {
    let warmup = (phases.pause_at / 3).max(usize::from(phases.pause_at >= 2));
    let from = warmup.min(phases.pause_at);
    let seconds = phases.pause_at - from;
    if seconds == 0 {
        return 0.0;
    }
    let ok: u64 = (from..phases.pause_at)
        .map(|s| series.get(s).map_or(0, |r| r.ok))
        .sum();
    ok as f64 / seconds as f64
}

const TOLERANCE: f64 = 1e-9;

/// Seconds from resume to the first second from which the server stays healthy; see the
/// [module docs](self). `None` if it never does, if the baseline is 0, or if the observation
/// is shorter than one window.
pub fn recovery_time(
    series: &[Second],
    phases: Phases,
    baseline: f64,
    criteria: RecoveryCriteria,
) -> Option<usize> {
    let window = criteria.window.max(1);
    if baseline <= 0.0 || phases.observe_for < window {
        return None;
    }
    let ok_min = criteria.ok_fraction * baseline;
    let timeout_max = criteria.timeout_fraction * baseline;
    // NOTE: the tolerance keeps "exactly 90%" on the healthy side and "exactly 1%" on the
    // unhealthy side, whatever the rounding of `0.9 * baseline`.
    let healthy =
        |ok: f64, timeouts: f64| ok + TOLERANCE >= ok_min && timeouts + TOLERANCE < timeout_max;
    let row = |s: usize| series.get(s).map_or((0, 0), |r| (r.ok, r.timeouts));
    let window_healthy = |start: usize| {
        let (ok, timeouts) = (start..start + window)
            .map(row)
            .fold((0u64, 0u64), |(a, b), (o, t)| (a + o, b + t));
        let w = window as f64;
        healthy(ok as f64 / w, timeouts as f64 / w)
    };
    let last_start = phases.end() - window;
    // Walk backwards over the windows: `stays_from` is the start of the final run of healthy
    // windows; the answer is the first second of it (or later) that is healthy on its own.
    let mut stays_from = None;
    for start in (phases.resume_at()..=last_start).rev() {
        if window_healthy(start) {
            stays_from = Some(start);
        } else {
            break;
        }
    }
    let from = stays_from?;
    (from..=last_start)
        .find(|&s| {
            let (ok, timeouts) = row(s);
            healthy(ok as f64, timeouts as f64)
        })
        .map(|s| s - phases.resume_at())
}

/// The `q` quantile (0..=1) of sorted `values`, nearest-rank; `None` when empty.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A comparison table of several runs, in fixed-width text.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a>(pub &'a [RunReport]);

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .0
            .iter()
            .map(|r| r.label.len())
            .max()
            .unwrap_or(0)
            .max(3);
        writeln!(
            f,
            "{:<width$}  {:>10}  {:>8}  {:>13}  {:>9}  {:>14}  {:>9}  {:>8}  {:>9}  {:>9}",
            "run",
            "baseline/s",
            "recovery",
            "amplification",
            "peak conc",
            "failed",
            "throttled",
            "p50 ok",
            "p99 ok",
            "p99 all",
        )?;
        for r in self.0 {
            let recovery = r
                .recovery
                .map_or_else(|| "never".to_owned(), |s| format!("{s} s"));
            let amplification = r
                .amplification
                .map_or_else(|| "-".to_owned(), |a| format!("{a:.2}"));
            let peak = r
                .peak_concurrency
                .map_or_else(|| "-".to_owned(), |c| c.to_string());
            let failed = r.failed_share().map_or_else(
                || r.failed.to_string(),
                |share| format!("{} ({:.1}%)", r.failed, share * 100.0),
            );
            let ms = |d: Option<Duration>| {
                d.map_or_else(|| "-".to_owned(), |d| format!("{} ms", d.as_millis()))
            };
            writeln!(
                f,
                "{:<width$}  {:>10.1}  {:>8}  {:>13}  {:>9}  {:>14}  {:>9}  {:>8}  {:>9}  {:>9}",
                r.label,
                r.baseline,
                recovery,
                amplification,
                peak,
                failed,
                r.throttled,
                ms(r.p50),
                ms(r.p99),
                ms(r.p99_outcome),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PHASES: Phases = Phases {
        pause_at: 9,
        pause_for: 5,
        observe_for: 20,
    };

    /// A run of `PHASES` where each second has the given OK and timeout counts and 100
    /// attempts per second outside the pause.
    fn series(ok: impl Fn(usize) -> u64, timeouts: impl Fn(usize) -> u64) -> Vec<Second> {
        (0..PHASES.end())
            .map(|s| Second {
                ok: ok(s),
                timeouts: timeouts(s),
                attempts: 100,
                ..Second::default()
            })
            .collect()
    }

    #[test]
    fn baseline_leaves_out_the_warm_up() {
        // Seconds 0..3 are warm-up (9 / 3); 3..9 average 100.
        let s = series(|s| if s < 3 { 10 } else { 100 }, |_| 0);
        assert!((baseline(&s, PHASES) - 100.0).abs() < 1e-9);
        let short = Phases {
            pause_at: 1,
            ..PHASES
        };
        assert!((baseline(&s, short) - 10.0).abs() < 1e-9);
        let none = Phases {
            pause_at: 0,
            ..PHASES
        };
        assert!(baseline(&s, none).abs() < 1e-9);
    }

    #[test]
    fn recovered_run() {
        // Down during the pause and 3 seconds after, then back at baseline.
        let resume = PHASES.resume_at();
        let s = series(
            |s| {
                if (PHASES.pause_at..resume + 3).contains(&s) {
                    0
                } else {
                    100
                }
            },
            |s| u64::from((PHASES.pause_at..resume + 3).contains(&s)) * 50,
        );
        let r = RunReport::compute("ok", &s, &[], PHASES);
        assert_eq!(r.recovery, Some(3));
        assert!(r.recovered());
        // 100 attempts per second in a 5-second pause at baseline 100: no amplification.
        assert_eq!(r.attempts_during_pause, 500);
        assert!((r.amplification.unwrap() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn never_recovered_run() {
        let resume = PHASES.resume_at();
        let s = series(
            |s| if s < PHASES.pause_at { 100 } else { 30 },
            |s| {
                if s >= resume { 70 } else { 0 }
            },
        );
        let r = RunReport::compute("down", &s, &[], PHASES);
        assert_eq!(r.recovery, None);
        assert!(!r.recovered());
    }

    #[test]
    fn a_relapse_resets_recovery() {
        // Healthy right after resume, but timeouts come back: not recovered from the first
        // healthy second, only after the relapse.
        let resume = PHASES.resume_at();
        let relapse = resume + 3;
        let s = series(|_| 100, |s| u64::from(s == relapse) * 20);
        let r = RunReport::compute("relapse", &s, &[], PHASES);
        assert_eq!(r.recovery, Some(4));
        // A relapse in the last window makes it "never".
        let s = series(|_| 100, |s| u64::from(s == PHASES.end() - 1) * 20);
        assert_eq!(RunReport::compute("late", &s, &[], PHASES).recovery, None);
    }

    #[test]
    fn noise_inside_the_window_is_tolerated() {
        // A single second at 70% between seconds at 100%: the 10-second mean stays >= 90%.
        let resume = PHASES.resume_at();
        let s = series(|s| if s == resume + 6 { 70 } else { 100 }, |_| 0);
        assert_eq!(
            RunReport::compute("noisy", &s, &[], PHASES).recovery,
            Some(0)
        );
    }

    #[test]
    fn the_first_healthy_second_must_be_healthy_on_its_own() {
        // The window from resume is healthy on average, but resume's own second is not.
        let resume = PHASES.resume_at();
        let s = series(|s| if s == resume { 80 } else { 100 }, |_| 0);
        assert_eq!(RunReport::compute("dip", &s, &[], PHASES).recovery, Some(1));
    }

    #[test]
    fn thresholds_are_inclusive_for_ok_and_strict_for_timeouts() {
        // Exactly 90% successes counts; timeouts exactly at 1% do not.
        let s = series(|s| if s < PHASES.pause_at { 100 } else { 90 }, |_| 0);
        assert_eq!(
            RunReport::compute("edge", &s, &[], PHASES).recovery,
            Some(0)
        );
        let s = series(|_| 100, |s| u64::from(s >= PHASES.resume_at()));
        assert_eq!(RunReport::compute("edge", &s, &[], PHASES).recovery, None);
    }

    #[test]
    fn edge_cases_give_no_recovery_and_no_amplification() {
        // No traffic at all: baseline 0.
        let s = series(|_| 0, |_| 0);
        let r = RunReport::compute("idle", &s, &[], PHASES);
        assert_eq!((r.recovery, r.amplification), (None, None));
        // An empty series is all zeros, not a panic.
        let r = RunReport::compute("empty", &[], &[], PHASES);
        assert_eq!((r.recovery, r.p50, r.peak_concurrency), (None, None, None));
        assert_eq!((r.requests, r.failed, r.failed_share()), (0, 0, None));
        // An observation shorter than the window cannot show recovery.
        let short = Phases {
            observe_for: 9,
            ..PHASES
        };
        let s: Vec<Second> = (0..short.end())
            .map(|_| Second {
                ok: 100,
                ..Second::default()
            })
            .collect();
        let r = RunReport::compute_with("short", &s, &[], short, RecoveryCriteria::default());
        assert_eq!(r.recovery, None);
        // With the window fitted to it, the same observation shows it.
        let s: Vec<Second> = (0..short.end())
            .map(|_| Second {
                ok: 100,
                ..Second::default()
            })
            .collect();
        assert_eq!(
            RunReport::compute("short", &s, &[], short).recovery,
            Some(0)
        );
        assert_eq!(RecoveryCriteria::for_phases(short).window, 4);
        assert_eq!(RecoveryCriteria::for_phases(PHASES).window, 10);
        let exact = Phases {
            observe_for: 10,
            ..PHASES
        };
        let s: Vec<Second> = (0..exact.end())
            .map(|_| Second {
                ok: 100,
                ..Second::default()
            })
            .collect();
        assert_eq!(
            RunReport::compute("exact", &s, &[], exact).recovery,
            Some(0)
        );
    }

    #[test]
    fn latency_and_concurrency_after_resume_only() {
        let mut s = series(|_| 100, |_| 0);
        s[0].latencies = vec![Duration::from_secs(100)];
        s[0].server_concurrency = Some(1000);
        let resume = PHASES.resume_at();
        s[resume].latencies = (1..=100).map(Duration::from_millis).collect();
        s[resume + 1].server_concurrency = Some(42);
        s[resume + 2].server_concurrency = Some(7);
        let r = RunReport::compute("lat", &s, &[], PHASES);
        assert_eq!(r.p50, Some(Duration::from_millis(50)));
        assert_eq!(r.p99, Some(Duration::from_millis(99)));
        assert_eq!(r.peak_concurrency, Some(42));
    }

    #[test]
    fn failures_and_time_to_outcome_tell_the_whole_truth() {
        let mut s = series(|_| 100, |_| 0);
        for row in &mut s {
            row.requests = 110;
        }
        let resume = PHASES.resume_at();
        // Before resume: a failure that neither p99 counts.
        s[2].failed = 3;
        s[2].failure_latencies = vec![Duration::from_secs(100); 3];
        // After resume: 100 successes of 10 ms, one failure after 7 s.
        s[resume].latencies = vec![Duration::from_millis(10); 100];
        s[resume + 1].failed = 1;
        s[resume + 1].failure_latencies = vec![Duration::from_secs(7)];
        let unfinished = [Duration::from_secs(20)];
        let r = RunReport::compute("truth", &s, &unfinished, PHASES);
        assert_eq!(r.requests, 110 * PHASES.end() as u64);
        assert_eq!((r.failed, r.unfinished), (5, 1));
        assert!((r.failed_share().unwrap() - 5.0 / r.requests as f64).abs() < 1e-12);
        // Successes alone look fast; every outcome does not.
        assert_eq!(r.p99, Some(Duration::from_millis(10)));
        assert_eq!(r.p99_outcome, Some(Duration::from_secs(7)));
        let text = Table(&[r]).to_string();
        assert!(text.contains("5 (0.1%)"), "{text}");
        assert!(text.contains("7000 ms"), "{text}");
    }

    #[test]
    fn percentile_nearest_rank() {
        let v: Vec<Duration> = [1, 2, 3, 4].map(Duration::from_millis).to_vec();
        assert_eq!(percentile(&v, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&v, 0.5), Some(Duration::from_millis(2)));
        assert_eq!(percentile(&v, 0.51), Some(Duration::from_millis(3)));
        assert_eq!(percentile(&v, 1.0), Some(Duration::from_millis(4)));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn table_prints_every_run() {
        let s = series(|_| 100, |_| 0);
        let a = RunReport::compute("full vs --stack full", &s, &[], PHASES);
        let b = RunReport::compute("fixed vs --stack none", &[], &[], PHASES);
        let text = Table(&[a, b]).to_string();
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("full vs --stack full"));
        assert!(text.contains("never"));
        assert!(text.contains("0 s"));
    }
}
