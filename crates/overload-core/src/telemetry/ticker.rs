//! A layer's background task: [`Ticker`] and [`spawn_ticker`].

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::sync::{AtomicBool, Ordering};

/// Calls `tick` with `state` every `period` on the current tokio runtime, for as long as
/// `state` has another owner; `false` (and nothing spawned) outside a runtime.
///
/// The task holds only a weak reference: it ends at the first tick after the layer's last
/// clone is dropped. Late ticks are delayed, never bunched. A layer that must keep a task
/// running across runtimes (a client built once and used from several) uses a [`Ticker`],
/// which starts the task again when the runtime that ran it has shut down.
///
/// The runtime needs its time driver (`Builder::enable_time` or `enable_all`, which
/// `#[tokio::main]` and every server runtime have), as every timer of the layers does;
/// without it the ticker task panics at its first tick (tokio catches the panic) and the
/// layer falls back to what its requests update. A [`Ticker`] then tries again after a
/// period, two, four, and so on.
pub fn spawn_ticker<T: Send + Sync + 'static>(
    state: &Arc<T>,
    period: Duration,
    tick: fn(&T),
) -> bool {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    spawn_ticks(&runtime, state, period, tick, ());
    true
}

/// What a tick task owns besides its state: told of every tick, and dropped with the task,
/// whether it ends (its state gone), is aborted, or is dropped unpolled by a runtime
/// shutting down.
trait TaskGuard: Send + 'static {
    fn ticked(&self) {}
}

impl TaskGuard for () {}

/// Spawns the tick loop on `runtime`, owning `guard`.
fn spawn_ticks<T: Send + Sync + 'static, G: TaskGuard>(
    runtime: &tokio::runtime::Handle,
    state: &Arc<T>,
    period: Duration,
    tick: fn(&T),
    guard: G,
) -> tokio::task::JoinHandle<()> {
    let weak: Weak<T> = Arc::downgrade(state);
    let period = period.max(Duration::from_millis(1));
    // NOTE: `guard` is moved into the future when it is made, not when it is first polled:
    // a runtime that shuts down before the task ever ran drops it all the same.
    runtime.spawn(async move {
        let guard = guard;
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let Some(state) = weak.upgrade() else { break };
            tick(&state);
            guard.ticked();
        }
    })
}

/// A layer's background task: started by its first request, and started again by a later
/// request once the task has ended; the one place where the "first request registers the
/// metrics and starts the ticker" step lives.
///
/// [`start`](Self::start) is cheap while the task runs (one relaxed load). The first call
/// claims the start, runs the layer's first-request work and spawns the tick on the
/// current tokio runtime (see [`spawn_ticker`]). Outside a runtime nothing can tick, so the
/// claim is given back and the next request tries again (running its first-request work
/// again: keep it idempotent).
///
/// **Across runtimes.** A layer built once may serve requests from several runtimes, one
/// after the other: a client kept in a `static`, a synchronous wrapper that builds a
/// runtime per call, a test suite that shares a client between `#[tokio::test]`s. The task
/// runs on the runtime of the request that started it, and ends with that runtime: the
/// runtime drops it when it shuts down, and a guard the task owns marks the ticker stopped
/// as it goes, so the next request, on whatever runtime it runs, starts it again. "Gone" is
/// decided by the task itself, never by how long ago it last ticked: a tick that is late
/// (a runtime starved of CPU, which is what an overload looks like) is not a dead one.
///
/// **Never per request.** A task is spawned at most once per `period`: a runtime that is
/// shutting down (which drops what is spawned on it at once) costs one spawn per period,
/// not one per request. A current-thread runtime that is kept but no longer driven keeps
/// its task, which then ticks only while the runtime runs; drive the layer from one
/// runtime at a time, or drop the runtimes you are done with.
///
/// The task is aborted when the ticker is dropped (with the layer that owns it).
#[derive(Debug, Default)]
pub struct Ticker {
    shared: Arc<TickerShared>,
}

#[derive(Debug, Default)]
struct TickerShared {
    running: AtomicBool,
    /// Whether the task spawned last has ticked at least once.
    ticked: AtomicBool,
    /// The task running, and when it was spawned (only the start path takes the lock).
    task: std::sync::Mutex<TickerTask>,
}

#[derive(Debug, Default)]
struct TickerTask {
    handle: Option<tokio::task::AbortHandle>,
    spawned: Option<tokio::time::Instant>,
    /// Tasks in a row that ended before their first tick.
    failed: u32,
}

/// The most a ticker waits before it tries again after tasks that never ticked: 10 minutes.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(600);

/// Owned by a ticker's task: marks the ticker stopped when the task goes, however it goes.
#[derive(Debug)]
struct RunningGuard(Arc<TickerShared>);

impl TaskGuard for RunningGuard {
    fn ticked(&self) {
        // NOTE: read first: a store per tick would do, but a load is cheaper.
        if !self.0.ticked.load(Ordering::Relaxed) {
            self.0.ticked.store(true, Ordering::Release);
        }
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}

impl Ticker {
    /// A ticker not started yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the tick task runs (a layer may leave per-request work to it then).
    #[inline]
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Relaxed)
    }

    /// On every request: if the task does not run, `first` runs on `state` and `tick` is
    /// spawned to run on it every `period` (see the [type docs](Self) for when it is
    /// started again).
    #[inline]
    pub fn start<T: Send + Sync + 'static>(
        &self,
        state: &Arc<T>,
        period: Duration,
        first: impl FnOnce(&T),
        tick: fn(&T),
    ) {
        if !self.is_running() {
            self.start_cold(state, period, first, tick);
        }
    }

    #[cold]
    fn start_cold<T: Send + Sync + 'static>(
        &self,
        state: &Arc<T>,
        period: Duration,
        first: impl FnOnce(&T),
        tick: fn(&T),
    ) {
        let shared = &self.shared;
        if shared
            .running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            first(state);
            shared.running.store(false, Ordering::Release);
            return;
        };
        let mut task = shared
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        // NOTE: a task gone before its first tick: the runtime is shutting down, or has no
        // time driver (the task panicked at its first tick). Wait before trying again: a
        // period after the first such task, then two, four, and so on (at most ten
        // minutes), so that a runtime without timers costs a handful of panics, not one a
        // period. A task that ticked ran on a runtime that has gone since: start anew.
        if shared.ticked.load(Ordering::Acquire) {
            task.failed = 0;
        } else if let Some(spawned) = task.spawned {
            let period = period.max(Duration::from_millis(1));
            let wait = period
                .saturating_mul(1 << task.failed.min(20))
                .min(MAX_RETRY_WAIT.max(period));
            if now < spawned + wait {
                drop(task);
                shared.running.store(false, Ordering::Release);
                return;
            }
            task.failed = task.failed.saturating_add(1);
        }
        first(state);
        shared.ticked.store(false, Ordering::Release);
        let guard = RunningGuard(Arc::clone(shared));
        let handle = spawn_ticks(&runtime, state, period, tick, guard);
        task.handle = Some(handle.abort_handle());
        task.spawned = Some(now);
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        let mut task = self
            .shared
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(handle) = task.handle.take() {
            handle.abort();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_ticker_runs_while_its_state_lives() {
        static TICKS: AtomicUsize = AtomicUsize::new(0);
        let state = Arc::new(());
        assert!(spawn_ticker(&state, Duration::from_secs(1), |()| {
            TICKS.fetch_add(1, Ordering::Relaxed);
        }));
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert_eq!(TICKS.load(Ordering::Relaxed), 3);
        drop(state);
        tokio::time::sleep(Duration::from_secs(5)).await;
        // The tick after the drop found no state and ended the task.
        assert_eq!(TICKS.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_ticker_outside_a_runtime_is_tried_again_by_the_next_request() {
        let ticker = Ticker::new();
        let state = Arc::new(AtomicUsize::new(0));
        let first = |s: &AtomicUsize| {
            s.fetch_add(1, Ordering::Relaxed);
        };
        ticker.start(&state, Duration::from_secs(1), first, |_| {});
        ticker.start(&state, Duration::from_secs(1), first, |_| {});
        assert!(!ticker.is_running());
        assert_eq!(state.load(Ordering::Relaxed), 2, "each request tried");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ticker_starts_once_on_the_first_request() {
        let ticker = Ticker::new();
        let state = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        for _ in 0..5 {
            ticker.start(
                &state,
                Duration::from_secs(1),
                |s| {
                    s.0.fetch_add(1, Ordering::Relaxed);
                },
                |s| {
                    s.1.fetch_add(1, Ordering::Relaxed);
                },
            );
        }
        assert!(ticker.is_running());
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!(
            state.0.load(Ordering::Relaxed),
            1,
            "first-request work once"
        );
        assert_eq!(state.1.load(Ordering::Relaxed), 2, "one tick task");
    }

    fn paused_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    /// Regression (issue 30, finding 1): a layer's task was started once, on the runtime of
    /// its first request, behind a flag that never reset; a layer used from a second
    /// runtime after the first was dropped (a `static` client, a runtime per call) never
    /// ticked again.
    #[test]
    fn a_ticker_starts_again_on_the_next_runtime_when_its_runtime_is_gone() {
        let ticker = Ticker::new();
        let state = Arc::new(AtomicUsize::new(0));
        let tick = |s: &AtomicUsize| {
            s.fetch_add(1, Ordering::Relaxed);
        };
        let first = paused_runtime();
        first.block_on(async {
            ticker.start(&state, Duration::from_secs(1), |_| {}, tick);
            tokio::time::sleep(Duration::from_millis(2_500)).await;
        });
        assert_eq!(state.load(Ordering::Relaxed), 2);
        assert!(ticker.is_running(), "its runtime still exists");
        drop(first);
        assert!(
            !ticker.is_running(),
            "the runtime dropped the task, and the guard said so"
        );

        let second = paused_runtime();
        second.block_on(async {
            ticker.start(&state, Duration::from_secs(1), |_| {}, tick);
            assert!(ticker.is_running());
            tokio::time::sleep(Duration::from_millis(3_500)).await;
        });
        assert_eq!(
            state.load(Ordering::Relaxed),
            5,
            "three ticks on the second runtime"
        );
    }

    /// A late tick is not a dead task: a runtime starved of CPU keeps its ticker, and no
    /// request starts a second one, however long the last tick is past.
    #[test]
    fn a_late_ticker_is_not_started_again() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let ticker = Ticker::new();
        let state = Arc::new(AtomicUsize::new(0));
        let starts = AtomicUsize::new(0);
        let first = |_: &AtomicUsize| {
            starts.fetch_add(1, Ordering::Relaxed);
        };
        runtime.block_on(async {
            ticker.start(&state, Duration::from_millis(10), first, |_| {});
            // NOTE: the runtime's only thread is blocked for fifteen periods, on purpose:
            // the task cannot tick, as on a client starved of CPU.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(150));
            for _ in 0..100 {
                ticker.start(&state, Duration::from_millis(10), first, |_| {});
            }
        });
        assert_eq!(starts.load(Ordering::Relaxed), 1);
    }

    /// A runtime that drops what is spawned on it at once (it is shutting down) costs one
    /// spawn per period, not one per request.
    #[test]
    fn a_dying_runtime_is_tried_at_most_once_per_period() {
        let ticker = Ticker::new();
        let state = Arc::new(AtomicUsize::new(0));
        let runtime = paused_runtime();
        let handle = runtime.handle().clone();
        // A runtime that has shut down takes spawns and drops them at once.
        runtime.shutdown_background();
        let _entered = handle.enter();
        for _ in 0..10 {
            ticker.start(
                &state,
                Duration::from_secs(3_600),
                |s| {
                    s.fetch_add(1, Ordering::Relaxed);
                },
                |_| {},
            );
            assert!(!ticker.is_running());
        }
        assert_eq!(state.load(Ordering::Relaxed), 1, "one spawn in the period");
    }

    /// Issue 30 (review): on a runtime without a time driver, every task panicked at its
    /// first tick and the next request spawned another, once a period, for ever. The waits
    /// double: 40 tries over 400 ms at a 10 ms period spawn a handful of tasks, not 40.
    #[test]
    fn a_runtime_without_timers_is_tried_less_and_less_often() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ticker = Ticker::new();
        let state = Arc::new(AtomicUsize::new(0));
        runtime.block_on(async {
            for _ in 0..40 {
                ticker.start(
                    &state,
                    Duration::from_millis(10),
                    |s| {
                        s.fetch_add(1, Ordering::Relaxed);
                    },
                    |_| {},
                );
                // Lets the task run (and panic: the runtime has no timers).
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
                // NOTE: real time, on purpose: this runtime has no timers to sleep on.
                #[allow(clippy::disallowed_methods)]
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let spawned = state.load(Ordering::Relaxed);
        // 0, 10, 30, 70, 150, 310 ms: six at the most, whatever the scheduling.
        assert!((2..=6).contains(&spawned), "{spawned} tasks spawned");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_ticker_aborts_its_task() {
        static TICKS: AtomicUsize = AtomicUsize::new(0);
        // The state outlives the ticker: only the abort can stop the task.
        let state = Arc::new(());
        let ticker = Ticker::new();
        ticker.start(
            &state,
            Duration::from_secs(1),
            |_| {},
            |()| {
                TICKS.fetch_add(1, Ordering::Relaxed);
            },
        );
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(TICKS.load(Ordering::Relaxed), 1);
        drop(ticker);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(TICKS.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn no_ticker_outside_a_runtime() {
        assert!(!spawn_ticker(
            &Arc::new(()),
            Duration::from_secs(1),
            |()| {}
        ));
    }
}
