//! An open-loop load: arrivals at instants fixed in advance ([`Schedule`]), each request its
//! own task, latencies from the scheduled instant ([`run`]).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cpu::{cores, cpu_time};
use super::outcome::{Attempt, Outcome, Point};
use super::settle::Settle;

/// How arrivals are spaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Evenly: request `k` at `k / rate` seconds. tokio's timer has a resolution of a
    /// millisecond, so gaps under 1 ms (rates over 1 000 req/s) are not honoured: the
    /// arrivals of each millisecond go out together when it ends (their latency still
    /// counts from their own scheduled instant).
    Fixed,
    /// A Poisson process of the rate (exponential gaps, the M of M/M/10), drawn from a
    /// generator seeded with `seed`, so a run is reproducible.
    Poisson {
        /// The generator's seed.
        seed: u64,
    },
}

/// When each request of a point is sent: a rate and a spacing.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    rate: f64,
    arrivals: Arrivals,
}

/// A schedule that cannot work; the message names the setting, its value and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSchedule(String);

impl fmt::Display for InvalidSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidSchedule {}

impl Schedule {
    /// `rate` requests a second, spaced as `arrivals` says.
    ///
    /// # Errors
    ///
    /// [`InvalidSchedule`] when `rate` is not a finite number above zero.
    pub fn new(rate: f64, arrivals: Arrivals) -> Result<Self, InvalidSchedule> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(InvalidSchedule(format!(
                "the rate must be a finite number of requests per second above zero, got {rate}"
            )));
        }
        Ok(Self { rate, arrivals })
    }

    /// Requests per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The instants (from the start) of the arrivals within `duration`, in order.
    pub fn offsets(&self, duration: Duration) -> impl Iterator<Item = Duration> + use<> {
        let rate = self.rate;
        let end = duration.as_secs_f64();
        let mut k = 0u64;
        let mut t = 0.0f64;
        let mut poisson = match self.arrivals {
            Arrivals::Fixed => None,
            Arrivals::Poisson { seed } => Some((
                SmallRng::seed_from_u64(seed),
                Exp::new(rate).expect("a finite rate above zero"),
            )),
        };
        std::iter::from_fn(move || {
            let at = match &mut poisson {
                // NOTE: k / rate from the start, not a sum of gaps: no drift over a long point.
                None => k as f64 / rate,
                Some((rng, gap)) => {
                    t += gap.sample(rng);
                    t
                }
            };
            k += 1;
            (at < end).then(|| Duration::from_secs_f64(at))
        })
    }
}

/// How far after its scheduled instant a request may start (its task's first poll) before
/// it counts as late: 5 ms.
///
/// tokio's timer has a resolution of a millisecond, so a sleep until an instant wakes up to
/// about 2 ms after it even when the generator keeps up (every latency carries that much);
/// a threshold of 1 ms counted nearly every arrival late.
pub const LATE_AFTER: Duration = Duration::from_millis(5);

/// Sends the arrivals of `schedule` for `duration`: at each scheduled instant, `send()` in a
/// task of its own, never waiting for earlier answers; at most `max_in_flight` at once, an
/// arrival over the cap is counted as dropped, not sent. Returns when every sent request has
/// ended (bound the time each may take inside `send`).
///
/// A served request's latency runs from its scheduled instant to the end of `send`. The
/// same as [`run_after_warmup`] with no warm-up.
pub async fn run<F, Fut>(
    schedule: &Schedule,
    duration: Duration,
    max_in_flight: usize,
    send: F,
) -> Point
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    run_after_warmup(schedule, Duration::ZERO, duration, max_in_flight, send).await
}

/// As [`run`], for `warmup + duration`, recording only the arrivals scheduled after the
/// first `warmup`: the load runs without a pause from the warm-up into the recorded part
/// (a limit that converged keeps its queue and state), and what was sent during the
/// warm-up is neither counted nor timed, though it holds its place under the cap; its
/// answers served inside the recorded window count in [`Point::served_in_window`].
///
/// The same as [`run_with_warmup`] with [`WarmUp::Fixed`] and a `send` that ignores its
/// scheduled instant.
pub async fn run_after_warmup<F, Fut>(
    schedule: &Schedule,
    warmup: Duration,
    duration: Duration,
    max_in_flight: usize,
    mut send: F,
) -> Point
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    run_with_warmup(
        schedule,
        WarmUp::Fixed(warmup),
        duration,
        max_in_flight,
        move |_| send(),
    )
    .await
}

/// How the warm-up of a point ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WarmUp {
    /// After this long, whatever the system is doing.
    Fixed(Duration),
    /// At the end of the first windows whose served rates agree ([`Settle`]), or at its
    /// cap; the same rule for every system.
    Settled(Settle),
}

/// The shared state of a point's tasks.
#[derive(Default)]
struct Shared {
    point: Point,
    /// The recorded window, once the warm-up has ended.
    window: Option<(Instant, Instant)>,
    /// Served answers per [`Settle::WINDOW`] since the start, by the instant they came.
    served_per_window: Vec<u64>,
}

/// As [`run_after_warmup`], the warm-up ending as `warmup` says, then `recorded` long
/// (what [`Point::warmup`] and [`Point::settled`] report). `send` gets each arrival's
/// scheduled instant (a request's deadline can run from there) and may end in
/// [`Attempt::NotSent`], counted as a drop by the generator.
///
/// Each request's task measures the generator's lag, from the scheduled instant to its
/// own first poll, when the request really starts (with every core busy, a runtime can
/// hold a spawned task for milliseconds): a lag over [`LATE_AFTER`] counts as late, and
/// [`Point::lag_quantile`] gives its spread. The process's CPU share over the recorded
/// window is [`Point::generator_cpu`].
pub async fn run_with_warmup<F, Fut>(
    schedule: &Schedule,
    warmup: WarmUp,
    recorded: Duration,
    max_in_flight: usize,
    mut send: F,
) -> Point
where
    F: FnMut(Instant) -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: Into<Attempt>,
{
    let (cap, settle) = match warmup {
        WarmUp::Fixed(warmup) => (warmup, None),
        WarmUp::Settled(settle) => (settle.cap(), Some(settle)),
    };
    let shared = Arc::new(Mutex::new(Shared::default()));
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    // NOTE: the warm-up ends at the cap at the latest, at or before the first arrival past
    // it: the arrivals up to a couple of gaps past `cap + recorded` always suffice.
    let spare = Duration::from_secs_f64((2.0 / schedule.rate()).clamp(1.0, 3_600.0));
    let horizon = cap.saturating_add(recorded).saturating_add(spare);
    let mut record_from: Option<Duration> = None;
    let mut windows_checked = 0;
    let mut cpu_from = None;
    for offset in schedule.offsets(horizon) {
        let scheduled = start + offset;
        tokio::time::sleep_until(scheduled).await;
        if record_from.is_none() {
            let complete = (offset.as_secs_f64() / Settle::WINDOW.as_secs_f64()) as usize;
            let settled_at = settle
                .filter(|_| complete > windows_checked)
                .and_then(|rule| {
                    windows_checked = complete;
                    let counts: Vec<u64> = {
                        let shared = shared.lock().expect("not poisoned");
                        (0..complete)
                            .map(|i| shared.served_per_window.get(i).copied().unwrap_or(0))
                            .collect()
                    };
                    // NOTE: this is the first arrival past the end of window `complete - 1`,
                    // so every earlier arrival is before `from`: the warm-up's, unrecorded.
                    rule.is_settled(&counts)
                        .then(|| Settle::WINDOW.saturating_mul(complete as u32))
                });
            let decided = settled_at
                .map(|from| (from, true))
                .or_else(|| (offset >= cap).then_some((cap, false)));
            if let Some((from, settled)) = decided {
                record_from = Some(from);
                let mut shared = shared.lock().expect("not poisoned");
                shared.window = Some((start + from, start + from + recorded));
                shared.point.warmup = from;
                shared.point.settled = settled;
                cpu_from = Some(CpuClock::now());
            }
        }
        let recorded_arrival = record_from.is_some_and(|from| offset >= from);
        if record_from.is_some_and(|from| offset >= from.saturating_add(recorded)) {
            break;
        }
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            if recorded_arrival {
                shared.lock().expect("not poisoned").point.dropped += 1;
            }
            continue;
        };
        let request = send(scheduled);
        let shared = Arc::clone(&shared);
        tasks.spawn(async move {
            // NOTE: the request starts here, at the task's first poll, not when the loop
            // spawned it: the lag between is the generator's, measured where it happens.
            let lag = Instant::now().saturating_duration_since(scheduled);
            let attempt: Attempt = request.await.into();
            let now = Instant::now();
            let took = now.duration_since(scheduled);
            drop(permit);
            // NOTE: one lock a request: the lag is written down with the outcome.
            let mut shared = shared.lock().expect("not poisoned");
            if recorded_arrival {
                shared.point.lags.push(lag);
                if lag > LATE_AFTER {
                    shared.point.late += 1;
                }
            }
            let Attempt::Ended(outcome) = attempt else {
                if recorded_arrival {
                    shared.point.dropped += 1;
                }
                return;
            };
            if outcome == Outcome::Served {
                let window = (now.duration_since(start).as_secs_f64()
                    / Settle::WINDOW.as_secs_f64()) as usize;
                if shared.served_per_window.len() <= window {
                    shared.served_per_window.resize(window + 1, 0);
                }
                shared.served_per_window[window] += 1;
                if shared
                    .window
                    .is_some_and(|(from, to)| from <= now && now < to)
                {
                    shared.point.served_in_window += 1;
                }
            }
            if !recorded_arrival {
                return;
            }
            match outcome {
                Outcome::Served => shared.point.served.push(took),
                Outcome::Rejected => shared.point.rejected += 1,
                Outcome::Failed => shared.point.failed += 1,
            }
        });
        // NOTE: reap finished tasks as we go, so a long point does not keep one JoinSet
        // entry per request it ever sent.
        while tasks.try_join_next().is_some() {}
    }
    let generator_cpu = cpu_from.and_then(|from| from.share_until_now());
    while tasks.join_next().await.is_some() {}
    let mut shared = shared.lock().expect("not poisoned");
    shared.point.generator_cpu = generator_cpu;
    shared.point.clone()
}

/// This process's CPU time and the real time at one instant, for a CPU share over a span.
struct CpuClock {
    cpu: Option<Duration>,
    // NOTE: real time on purpose: CPU time is real, and tokio's clock may be paused.
    #[allow(clippy::disallowed_types)]
    wall: std::time::Instant,
}

impl CpuClock {
    #[allow(clippy::disallowed_methods, clippy::disallowed_types)]
    fn now() -> Self {
        Self {
            cpu: cpu_time(None),
            wall: std::time::Instant::now(),
        }
    }

    /// The CPU used since `self` over the real time since, as a share of every core;
    /// `None` without `/proc` or over less than a second (the kernel counts CPU time in
    /// ticks of 10 ms: a shorter span would be mostly rounding).
    fn share_until_now(&self) -> Option<f64> {
        let now = Self::now();
        let wall = now.wall.duration_since(self.wall).as_secs_f64();
        if wall < 1.0 {
            return None;
        }
        let used = now.cpu?.checked_sub(self.cpu?)?;
        Some(used.as_secs_f64() / (wall * cores() as f64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_arrivals_are_evenly_spaced_and_stop_before_the_end() {
        let schedule = Schedule::new(4.0, Arrivals::Fixed).unwrap();
        let offsets: Vec<_> = schedule.offsets(Duration::from_secs(1)).collect();
        assert_eq!(
            offsets,
            [0, 250, 500, 750].map(Duration::from_millis).to_vec()
        );
    }

    #[test]
    fn poisson_arrivals_keep_the_rate_and_repeat_with_the_seed() {
        let schedule = Schedule::new(1000.0, Arrivals::Poisson { seed: 7 }).unwrap();
        let n = schedule.offsets(Duration::from_secs(10)).count();
        // 10 000 expected; a Poisson count's standard deviation is 100.
        assert!((9_600..=10_400).contains(&n), "{n}");
        let again = schedule.offsets(Duration::from_secs(10)).count();
        assert_eq!(n, again);
        let offsets: Vec<_> = schedule.offsets(Duration::from_secs(1)).collect();
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_rate_that_cannot_work_is_refused() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = Schedule::new(rate, Arrivals::Fixed).unwrap_err();
            assert!(e.to_string().contains("above zero, got"), "{e}");
        }
    }

    /// The loop is open: a system that takes 1 s per answer still gets every arrival, on
    /// time, and its latency counts from the schedule.
    #[tokio::test(start_paused = true)]
    async fn slow_answers_do_not_slow_the_offered_load() {
        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let started = Instant::now();
        let sent_at = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::clone(&sent_at);
        let point = run(&schedule, Duration::from_secs(1), 1000, move || {
            sent.lock().unwrap().push(started.elapsed());
            async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Outcome::Served
            }
        })
        .await;
        assert_eq!(point.served(), 100);
        assert_eq!((point.dropped(), point.late()), (0, 0));
        let sent_at = sent_at.lock().unwrap();
        assert_eq!(sent_at[99], Duration::from_millis(990));
        assert_eq!(point.served_quantile(1.0), Some(Duration::from_secs(1)));
        // The last answer came 1 s after the last arrival.
        assert_eq!(started.elapsed(), Duration::from_millis(1990));
    }

    #[tokio::test(start_paused = true)]
    async fn arrivals_over_the_in_flight_cap_are_dropped_and_outcomes_counted_apart() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (inside2, most2) = (Arc::clone(&inside), Arc::clone(&most));
        let mut k = 0u32;
        let point = run(&schedule, Duration::from_secs(1), 5, move || {
            k += 1;
            let outcome = match k % 3 {
                0 => Outcome::Served,
                1 => Outcome::Rejected,
                _ => Outcome::Failed,
            };
            let now = inside2.fetch_add(1, Ordering::SeqCst) + 1;
            most2.fetch_max(now, Ordering::SeqCst);
            let inside = Arc::clone(&inside2);
            async move {
                // 100 ms each at 10 ms apart: 10 would be in flight, the cap is 5.
                tokio::time::sleep(Duration::from_millis(100)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                outcome
            }
        })
        .await;
        assert_eq!(point.offered(), 100);
        assert_eq!(most.load(Ordering::SeqCst), 5, "the cap holds");
        assert!((40..=60).contains(&point.dropped()), "{point:?}");
        assert!(point.served() > 0 && point.rejected() > 0 && point.failed() > 0);
        assert_eq!(inside.load(Ordering::SeqCst), 0, "every request ended");
    }

    /// The warm-up's arrivals are sent (the load does not pause) but neither counted nor
    /// timed: 100/s for 0.5 s of warm-up and 1 s recorded sends 150 and records 100.
    #[tokio::test(start_paused = true)]
    async fn the_warmup_is_sent_but_not_recorded() {
        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let mut sent = 0u32;
        let point = run_after_warmup(
            &schedule,
            Duration::from_millis(500),
            Duration::from_secs(1),
            1000,
            || {
                sent += 1;
                // The warm-up's answers are rejections; the recorded part's are served.
                let outcome = if sent <= 50 {
                    Outcome::Rejected
                } else {
                    Outcome::Served
                };
                async move {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    outcome
                }
            },
        )
        .await;
        assert_eq!(sent, 150);
        assert_eq!(
            (point.served(), point.rejected(), point.offered()),
            (100, 0, 100)
        );
        assert_eq!(point.served_quantile(1.0), Some(Duration::from_millis(30)));
    }

    /// Review S10 (the real-time version of this test asserted zero lateness on a shared
    /// machine, and failed whenever the test thread was descheduled): under paused time, a
    /// generator on time is never late.
    #[tokio::test(start_paused = true)]
    async fn a_generator_on_time_is_never_late() {
        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let on_time = run(&schedule, Duration::from_millis(300), 100, || async {
            Outcome::Served
        })
        .await;
        assert_eq!((on_time.served(), on_time.late()), (30, 0), "{on_time:?}");
        assert_eq!(on_time.lag_quantile(1.0), Some(Duration::ZERO));
    }

    /// Review M2: the generator's lag is measured where the request starts, at its task's
    /// first poll. Here another task, queued before the first request's own, holds the
    /// runtime for 30 ms: the first request was spawned on time but starts 30 ms late (the
    /// scheduler loop, which measured lateness before the fix, saw it on time and counted
    /// only the two arrivals it itself sent late: 2, not 3).
    #[tokio::test(start_paused = true)]
    async fn a_request_whose_task_starts_late_counts_late_though_spawned_on_time() {
        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let mut first = true;
        let held_up = run(&schedule, Duration::from_millis(300), 100, || {
            if std::mem::take(&mut first) {
                tokio::spawn(tokio::time::advance(Duration::from_millis(30)));
            }
            async { Outcome::Served }
        })
        .await;
        // The arrivals at 0, 10 and 20 ms start at 30 ms.
        assert_eq!(held_up.late(), 3, "{held_up:?}");
        assert_eq!(held_up.lag_quantile(1.0), Some(Duration::from_millis(30)));
        assert_eq!(held_up.lag_quantile(0.5), Some(Duration::ZERO));
    }

    /// A system whose served rate ramps for 10 s: a share `t / 10 s` of the arrivals at
    /// `t` is served, the rest rejected, then everything is served. Answers take 50 ms.
    fn ramping(started: Instant) -> impl FnMut(Instant) -> std::future::Ready<Outcome> {
        let mut k = 0u64;
        move |scheduled| {
            k += 1;
            let seconds = scheduled.duration_since(started).as_secs();
            std::future::ready(if k % 10 < seconds {
                Outcome::Served
            } else {
                Outcome::Rejected
            })
        }
    }

    /// Review M1: a fixed warm-up of 1 s (the old default) after a fresh start records a
    /// system's ramp as its result; warming up until the served rate settles records it
    /// only after the ramp, and says how long that took.
    #[tokio::test(start_paused = true)]
    async fn a_system_that_ramps_for_10_s_is_recorded_only_after_it_settles() {
        let schedule = Schedule::new(200.0, Arrivals::Fixed).unwrap();
        let slow = |mut send: Box<dyn FnMut(Instant) -> std::future::Ready<Outcome>>| {
            move |scheduled| {
                let answer = send(scheduled);
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    answer.await
                }
            }
        };
        let started = Instant::now();
        let fixed = run_with_warmup(
            &schedule,
            WarmUp::Fixed(Duration::from_secs(1)),
            Duration::from_secs(4),
            4096,
            slow(Box::new(ramping(started))),
        )
        .await;
        assert!(!fixed.settled());
        assert!(
            fixed.rejected() > 400,
            "the ramp recorded: {}",
            fixed.rejected()
        );

        let started = Instant::now();
        let settled = run_with_warmup(
            &schedule,
            WarmUp::Settled(Settle::new(Duration::from_secs(60))),
            Duration::from_secs(4),
            4096,
            slow(Box::new(ramping(started))),
        )
        .await;
        assert!(settled.settled());
        // The three 2 s windows after the ramp agree at 16 s.
        assert_eq!(settled.warmup(), Duration::from_secs(16));
        assert_eq!(
            (
                settled.served(),
                settled.rejected(),
                settled.served_in_window()
            ),
            (800, 0, 800)
        );
    }

    /// A warm-up that never settles ends at its cap, and the point says so.
    #[tokio::test(start_paused = true)]
    async fn a_warmup_that_never_settles_ends_at_its_cap() {
        let schedule = Schedule::new(200.0, Arrivals::Fixed).unwrap();
        let started = Instant::now();
        let point = run_with_warmup(
            &schedule,
            WarmUp::Settled(Settle::new(Duration::from_secs(5))),
            Duration::from_secs(1),
            4096,
            ramping(started),
        )
        .await;
        assert!(!point.settled());
        assert_eq!(point.warmup(), Duration::from_secs(5));
        assert_eq!(point.offered(), 200);
    }

    /// Review S1: an arrival the generator could not send is its drop, not a failure.
    #[tokio::test(start_paused = true)]
    async fn arrivals_the_generator_could_not_send_are_drops() {
        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let mut k = 0;
        let point = run_with_warmup(
            &schedule,
            WarmUp::Fixed(Duration::ZERO),
            Duration::from_secs(1),
            100,
            move |_| {
                k += 1;
                std::future::ready(if k % 4 == 0 {
                    Attempt::NotSent
                } else {
                    Attempt::Ended(Outcome::Served)
                })
            },
        )
        .await;
        assert_eq!(
            (point.served(), point.dropped(), point.failed()),
            (75, 25, 0)
        );
    }

    /// Goodput counts the answers served within the recorded window, whenever their
    /// request arrived: with 500 ms answers at 100/s over 2 s, 200 are served (and timed)
    /// but only the 150 answered before the end fall in the window; the warm-up's answers
    /// that come inside it count too.
    #[tokio::test(start_paused = true)]
    async fn the_window_counts_the_answers_served_inside_it() {
        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let slow = |ms| {
            move || async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Outcome::Served
            }
        };
        let point = run(&schedule, Duration::from_secs(2), 1000, slow(500)).await;
        assert_eq!((point.served(), point.served_in_window()), (200, 150));
        let warmed = run_after_warmup(
            &schedule,
            Duration::from_millis(500),
            Duration::from_secs(1),
            1000,
            slow(200),
        )
        .await;
        // 80 recorded arrivals answered before the end, and 20 of the warm-up's.
        assert_eq!((warmed.served(), warmed.served_in_window()), (100, 100));
    }
}
