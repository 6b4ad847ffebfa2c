//! What a window samples: the requests a baseline measurement takes (the first N *admitted*
//! in it, however long they take), and when held and dropped requests are sampled.
//!
//! A measurement that took the first N requests to *complete* read only the quick ones
//! (those still running when the N-th completed are the slow ones), so its baseline was
//! low, by about 10 % on exponential service times at a probe's concurrency of 7, and the
//! limit settled nearer the knee than its target says (issue 34).

use overload_core::clock::saturating_nanos;
use overload_core::sync::{AtomicBool, AtomicU64, Ordering};

use super::controller::{ControllerPhase, GradientController};
use super::held::{
    RELEASE_AFTER_MAX, RELEASE_AFTER_MIN, RELEASE_AFTER_TARGETS, RELEASE_AFTER_UNMEASURED,
};

/// The bookkeeping of a window that measures the baseline (a probe, or the first
/// measurement); idle while the limit tracks.
pub(super) struct Measurement {
    /// How many more admitted requests the measurement samples; 0 otherwise.
    quota: AtomicU64,
    /// Whether the window measures the baseline: it samples only the requests admitted on
    /// its quota, and counts `lost`.
    measuring: AtomicBool,
    /// Requests the measurement sampled that ended with no outcome (dropped, left out,
    /// released): they count toward closing it, or it would wait for its deadline.
    lost: AtomicU64,
}

impl Measurement {
    /// The bookkeeping of the controller's first window.
    pub(super) fn new(controller: &GradientController) -> Self {
        let measurement = Self {
            quota: AtomicU64::new(0),
            measuring: AtomicBool::new(false),
            lost: AtomicU64::new(0),
        };
        measurement.open(controller);
        measurement
    }

    /// A new window opens (the controller has taken the last one's stats): the quota of a
    /// measurement, or none.
    pub(super) fn open(&self, controller: &GradientController) {
        let measuring = controller.measures_baseline();
        self.lost.store(0, Ordering::Relaxed);
        self.measuring.store(measuring, Ordering::Relaxed);
        // NOTE: `Release`, read `Acquire` by the admission that sees the quota: it reads the
        // sample floor stored before this.
        self.quota.store(
            if measuring {
                controller.samples_needed()
            } else {
                0
            },
            Ordering::Release,
        );
    }

    /// An admission at `now`: whether it is one of the requests the measurement samples
    /// (it took a slot of the quota). A request admitted before `floor` (the measurement's
    /// start) takes none.
    #[inline]
    pub(super) fn admit(&self, now: u64, floor: &AtomicU64) -> bool {
        self.quota.load(Ordering::Acquire) != 0 && self.take_slot(now, floor)
    }

    #[cold]
    fn take_slot(&self, now: u64, floor: &AtomicU64) -> bool {
        now >= floor.load(Ordering::Relaxed)
            && self
                .quota
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }

    /// Whether a completed request admitted after the sample floor is sampled: any while
    /// the limit tracks, only those admitted on the quota while it measures.
    #[inline]
    pub(super) fn samples(&self, measured: bool) -> bool {
        measured || !self.measuring.load(Ordering::Relaxed)
    }

    /// `count` requests ended with no outcome: while measuring, they count toward closing
    /// the window.
    #[inline]
    pub(super) fn lose(&self, count: u64) {
        if self.measuring.load(Ordering::Relaxed) {
            self.lost.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Requests the measurement sampled that ended with no outcome.
    #[inline]
    pub(super) fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

/// How long a request may be in flight before the tick releases it (clock nanoseconds):
/// the setting, or ten times the target latency (the baseline times the tolerance) within
/// 1..=30 s, or 5 s while no baseline is known.
pub(super) fn release_after(
    fixed: Option<u64>,
    controller: &GradientController,
    tolerance: f64,
) -> u64 {
    if let Some(fixed) = fixed {
        return fixed;
    }
    match controller.baseline() {
        Some(baseline) => {
            // Float to integer casts saturate.
            let bound = (baseline as f64 * tolerance * RELEASE_AFTER_TARGETS) as u64;
            bound.clamp(
                saturating_nanos(RELEASE_AFTER_MIN),
                saturating_nanos(RELEASE_AFTER_MAX),
            )
        }
        None => saturating_nanos(RELEASE_AFTER_UNMEASURED),
    }
}

/// The time after which a dropped request is sampled, for the controller's state: the
/// baseline times the tolerance, or never (`u64::MAX`) while there is no baseline or one is
/// being measured (its samples must be completed requests).
pub(super) fn slow_drop(controller: &GradientController, tolerance: f64) -> u64 {
    match (controller.baseline(), controller.phase()) {
        (Some(baseline), ControllerPhase::Tracking) => {
            // Float to integer casts saturate: a huge product is `u64::MAX`, never sampled.
            (baseline as f64 * tolerance) as u64
        }
        _ => u64::MAX,
    }
}
