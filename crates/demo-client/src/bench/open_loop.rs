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

use super::outcome::{Outcome, Point};

/// How arrivals are spaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Evenly: request `k` at `k / rate` seconds.
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

/// How far after its scheduled instant a request may go out before it counts as late: 5 ms.
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
    let point = Arc::new(Mutex::new(Point::default()));
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let window = (start + warmup, start + warmup + duration);
    for offset in schedule.offsets(warmup + duration) {
        let recorded = offset >= warmup;
        let scheduled = start + offset;
        tokio::time::sleep_until(scheduled).await;
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            if recorded {
                point.lock().expect("not poisoned").dropped += 1;
            }
            continue;
        };
        if recorded && Instant::now().duration_since(scheduled) > LATE_AFTER {
            point.lock().expect("not poisoned").late += 1;
        }
        let request = send();
        let point = Arc::clone(&point);
        tasks.spawn(async move {
            let outcome = request.await;
            let now = Instant::now();
            let took = now.duration_since(scheduled);
            drop(permit);
            let in_window = window.0 <= now && now < window.1;
            let mut point = point.lock().expect("not poisoned");
            if outcome == Outcome::Served && in_window {
                point.served_in_window += 1;
            }
            if !recorded {
                return;
            }
            match outcome {
                Outcome::Served => point.served.push(took),
                Outcome::Rejected => point.rejected += 1,
                Outcome::Failed => point.failed += 1,
            }
        });
        // NOTE: reap finished tasks as we go, so a long point does not keep one JoinSet
        // entry per request it ever sent.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let point = point.lock().expect("not poisoned");
    point.clone()
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

    /// Real time: tokio's timer wakes a sleep up to about a millisecond after its instant,
    /// so a generator on time is not counted late; one held up by 30 ms is, for the
    /// arrivals it missed.
    #[tokio::test(flavor = "current_thread")]
    async fn only_arrivals_held_up_past_the_timers_resolution_are_late() {
        let schedule = Schedule::new(100.0, Arrivals::Fixed).unwrap();
        let on_time = run(&schedule, Duration::from_millis(300), 100, || async {
            Outcome::Served
        })
        .await;
        assert_eq!((on_time.served(), on_time.late()), (30, 0), "{on_time:?}");
        let mut first = true;
        let held_up = run(&schedule, Duration::from_millis(300), 100, || {
            if std::mem::take(&mut first) {
                // Blocks the generator on purpose: the arrivals at 10 and 20 ms go out at
                // about 30 ms.
                #[allow(clippy::disallowed_methods)]
                std::thread::sleep(Duration::from_millis(30));
            }
            async { Outcome::Served }
        })
        .await;
        assert!(held_up.late() >= 2, "{held_up:?}");
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
