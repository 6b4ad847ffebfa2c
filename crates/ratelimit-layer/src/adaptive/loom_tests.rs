//! Model tests of the adaptive limit's admission under loom: every interleaving of a few
//! threads.
//!
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p ratelimit-layer --lib --release loom`
//!
//! The in-flight count, the generations of admissions and the window's counters are loom's
//! atomics under `cfg(loom)`. The models check that admission never overdraws the limit
//! (more requests held at once than it allows), that every admitted request gives its slot
//! back exactly once, whether it completes, is dropped, or is released by the tick for
//! being held too long (and then completes), and that no outcome recorded into the window
//! is lost.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use overload_core::clock::Clock;
use overload_signal::protocol::Criticality;

use super::controller::AdaptiveSettings;
use super::state::{AdaptiveLimitState, CompleteRequest, Completion};

/// A clock that stands still: windows never close, so the model is admission alone.
struct Still;

impl Clock for Still {
    fn now(&self) -> u64 {
        0
    }
}

/// A limit of `limit`, tracking from a seeded baseline: no baseline measurement takes a slot
/// of its quota at each admission (that race has its own model, on [`measuring`]).
fn shared(limit: usize) -> AdaptiveLimitState<Still> {
    state(limit, 1_000, Some(EPOCH))
}

/// A state measuring its first baseline, which samples the first `samples` admitted.
fn measuring(limit: usize, samples: u64) -> AdaptiveLimitState<Still> {
    state(limit, samples, None)
}

fn state(limit: usize, samples: u64, baseline: Option<u64>) -> AdaptiveLimitState<Still> {
    let settings = AdaptiveSettings {
        initial_limit: limit,
        min_limit: limit,
        max_limit: limit,
        window: Duration::from_millis(100),
        min_samples: 1_000,
        quantile: 0.5,
        tolerance: 1.25,
        probe_interval: Duration::from_secs(60),
        probe_jitter: 0.0,
        probe_samples: samples,
        probe_share: 0.25,
        probe_timeout: Duration::from_secs(5),
        failure_threshold: 0.1,
        backoff: 0.9,
        baseline,
        seed: 0,
    };
    AdaptiveLimitState::new(
        settings,
        Still,
        Duration::from_secs(1),
        overload_core::telemetry::LayerName::new("loom").unwrap(),
        Duration::from_secs(10),
        None,
        Some(Duration::from_secs(1)),
    )
    .with_reserves(overload_signal::criticality::Reserves::new())
}

/// One second, the bound of [`shared`]'s layers, in clock nanoseconds.
const EPOCH: u64 = 1_000_000_000;

/// Every interleaving: two threads keep the models to a few thousand schedules (a third
/// multiplies them past what a CI run can wait for).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = None;
    builder.check(f);
}

/// Two requests race for the one slot of a limit of 1: never both held at once, at least
/// one admitted, and the slot back in the end, whether its request completed or was
/// dropped.
#[test]
fn loom_admission_never_overdraws_and_every_slot_comes_back() {
    for dropped in [false, true] {
        model(move || {
            let shared = Arc::new(shared(1));
            let held = Arc::new(AtomicUsize::new(0));
            let admitted = Arc::new(AtomicUsize::new(0));
            let request = {
                let shared = Arc::clone(&shared);
                let held = Arc::clone(&held);
                let admitted = Arc::clone(&admitted);
                move |completion: Completion| {
                    if let Some(slot) = shared.try_admit(Criticality::Critical) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        let now = held.fetch_add(1, Ordering::AcqRel) + 1;
                        assert!(now <= 1, "{now} requests held under a limit of 1");
                        held.fetch_sub(1, Ordering::AcqRel);
                        shared.complete(&slot, completion);
                    }
                }
            };
            let other = request.clone();
            let t = thread::spawn(move || other(Completion::Served));
            request(if dropped {
                Completion::Dropped
            } else {
                Completion::Overloaded
            });
            t.join().unwrap();
            assert_eq!(
                shared.status().in_flight,
                0,
                "a slot was lost or given back twice"
            );
            assert!(
                admitted.load(Ordering::Relaxed) >= 1,
                "a free slot was refused"
            );
        });
    }
}

/// Two requests complete at once, a success and a failure: the window holds both.
#[test]
fn loom_no_recorded_outcome_is_lost() {
    model(|| {
        let shared = Arc::new(shared(2));
        let other = Arc::clone(&shared);
        let t = thread::spawn(move || {
            let slot = other
                .try_admit(Criticality::Critical)
                .expect("under the limit");
            other.complete(&slot, Completion::Overloaded);
        });
        let slot = shared
            .try_admit(Criticality::Critical)
            .expect("under the limit");
        shared.complete(&slot, Completion::Served);
        t.join().unwrap();
        assert_eq!(shared.outcomes(), 2);
    });
}

/// A request admitted and completed (or dropped) while the tick changes generations twice,
/// which releases any request admitted before the first change: in every interleaving its
/// slot comes back once, by its completion or by the release (then its completion counts
/// nothing). A double decrement wraps the in-flight count; a lost slot leaves it at 1; a
/// release counted twice or never leaves the released count off zero.
#[test]
fn loom_a_request_racing_the_release_gives_its_slot_back_once() {
    for completion in [Completion::Served, Completion::Dropped] {
        model(move || {
            let shared = Arc::new(shared(2));
            let other = Arc::clone(&shared);
            let t = thread::spawn(move || {
                let slot = other
                    .try_admit(Criticality::Critical)
                    .expect("under the limit");
                other.complete(&slot, completion);
            });
            shared.release_held(EPOCH);
            shared.release_held(2 * EPOCH);
            t.join().unwrap();
            let status = shared.status();
            assert_eq!(status.in_flight, 0, "{status:?}");
            assert_eq!(status.released, 0, "{status:?}");
        });
    }
}

/// A request admitted before the tick released its generation, completed after: the tick
/// takes it off the in-flight count, its completion does not again; another request racing
/// the release is counted in one generation only. The limit (2) is never overdrawn by the
/// released request's slot coming back.
#[test]
fn loom_a_released_request_is_not_counted_again_when_it_completes() {
    model(|| {
        let shared = Arc::new(shared(2));
        let old = shared
            .try_admit(Criticality::Critical)
            .expect("under the limit");
        let other = Arc::clone(&shared);
        let t = thread::spawn(move || {
            other.release_held(EPOCH);
            other.release_held(2 * EPOCH);
        });
        let racing = shared
            .try_admit(Criticality::Critical)
            .expect("under the limit");
        t.join().unwrap();
        let status = shared.status();
        // `old` was admitted before the first change: released by the second. `racing` is
        // still counted, or was released with `old`: never both, never neither.
        assert!(status.released >= 1, "{status:?}");
        assert_eq!(status.in_flight + status.released, 2, "{status:?}");
        shared.complete(&racing, Completion::Served);
        shared.complete(&old, Completion::Served);
        let status = shared.status();
        assert_eq!((status.in_flight, status.released), (0, 0), "{status:?}");
    });
}

/// A `sheddable` request races a `critical` one for a limit of 2, `critical` active and one
/// `critical` request in flight: `sheddable` may take only half the limit, so it is refused
/// in every interleaving and the racing `critical` request is admitted in every one.
#[test]
fn loom_a_racing_sheddable_request_never_takes_the_room_left_for_critical() {
    model(|| {
        let shared = Arc::new(shared(2));
        let first = shared
            .try_admit(Criticality::Critical)
            .expect("an empty limit");
        let other = Arc::clone(&shared);
        let t = thread::spawn(move || other.try_admit(Criticality::Sheddable));
        let critical = shared.try_admit(Criticality::Critical);
        let sheddable = t.join().unwrap();
        assert!(sheddable.is_none(), "sheddable took the top half");
        let critical = critical.expect("critical was refused its room");
        shared.complete(&first, Completion::Served);
        shared.complete(&critical, Completion::Served);
        assert_eq!(shared.status().in_flight, 0);
    });
}

/// Two requests admitted at once while the baseline measurement has one sample left: exactly
/// one of them is the measured one, whatever the interleaving (the quota is never overdrawn
/// nor lost).
#[test]
fn loom_a_measurement_samples_exactly_its_quota_of_admissions() {
    model(|| {
        let state = Arc::new(measuring(2, 1));
        let other = Arc::clone(&state);
        let racer = thread::spawn(move || {
            other
                .try_admit(Criticality::default())
                .expect("a limit of 2")
                .measured
        });
        let mine = state
            .try_admit(Criticality::default())
            .expect("a limit of 2")
            .measured;
        let theirs = racer.join().unwrap();
        assert!(mine ^ theirs, "measured: {mine}, {theirs}");
    });
}
