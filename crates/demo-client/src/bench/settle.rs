//! When a point's warm-up ends: once the served rate has settled, decided by the same rule
//! for every system ([`Settle`]), or at a cap.
//!
//! Every point starts its system fresh, and the systems start differently: our adaptive
//! limit converges within a second, little-loadshedder starts at a concurrency of 1 and
//! grows by one step every 0.5 to 1 s (some 30 s to reach article's knee), Envoy's gradient
//! controller samples its minimum RTT at a concurrency of 3 before it grows. A warm-up of a
//! fixed length fits one of them; a window recorded during another's ramp measures its
//! start-up, not its steady state. So the load runs until the served rate stops moving,
//! whatever the system, and the warm-up each point needed is printed.

use std::time::Duration;

/// The rule that ends a warm-up: the served answers counted in consecutive windows of
/// [`WINDOW`](Settle::WINDOW) since the start; the warm-up ends at the end of the first
/// run of [`WINDOWS`](Settle::WINDOWS) windows whose counts are within
/// [`TOLERANCE`](Settle::TOLERANCE) of each other, or at the cap.
///
/// ```
/// use std::time::Duration;
/// use demo_client::bench::settle::Settle;
///
/// let settle = Settle::new(Duration::from_secs(60));
/// // Three 2 s windows within 10 % of each other: settled.
/// assert!(settle.is_settled(&[120, 390, 400, 410]));
/// // Still climbing by more than 10 % over the last three: not yet.
/// assert!(!settle.is_settled(&[120, 300, 350, 400]));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settle {
    cap: Duration,
}

impl Settle {
    /// The width of a window: 2 s. At the smallest rate a saturated point serves (mmc's
    /// 200 req/s) a window holds about 400 answers, whose count varies by about 5 % (the
    /// departures of a saturated M/M/10 are close to Poisson: a standard deviation of
    /// sqrt(400) = 20), so a settled system passes [`TOLERANCE`](Self::TOLERANCE) most of
    /// the time; a 1 s window varies by 7 % and would keep a settled system warming up.
    pub const WINDOW: Duration = Duration::from_secs(2);

    /// How many consecutive windows must agree: 3. Two could pass in the middle of a slow
    /// ramp (little on article climbs about 10 req/s each second or two, under 10 % of its
    /// rate from one window to the next); over three windows such a ramp moves by more than
    /// the tolerance.
    pub const WINDOWS: usize = 3;

    /// How far apart the windows' counts may be: the largest minus the smallest at most
    /// 10 % of the largest, plus 2 answers (so that a rate near zero, a collapsed bare
    /// server, settles too). One step of little's ramp near the top is about 10 % of the
    /// capacity; the noise of three 400-answer windows spans about 8 %.
    pub const TOLERANCE: f64 = 0.10;

    /// A rule capped at `cap`: a warm-up that has not settled by then ends there, and the
    /// point is marked as not settled. A zero cap records from the first arrival.
    pub const fn new(cap: Duration) -> Self {
        Self { cap }
    }

    /// The longest warm-up.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// Whether the counts of served answers in consecutive windows (`counts[i]` in window
    /// `i`, the last one complete) have settled: the last [`WINDOWS`](Self::WINDOWS) are
    /// within [`TOLERANCE`](Self::TOLERANCE) of each other.
    pub fn is_settled(&self, counts: &[u64]) -> bool {
        let Some(last) = counts.len().checked_sub(Self::WINDOWS) else {
            return false;
        };
        let recent = &counts[last..];
        let most = recent.iter().copied().max().unwrap_or(0);
        let least = recent.iter().copied().min().unwrap_or(0);
        (most - least) as f64 <= Self::TOLERANCE * most as f64 + 2.0
    }
}

/// The default cap of a point's warm-up: 60 s, twice the slowest start-up known among the
/// systems (little-loadshedder on article, about 30 s by its code: one concurrency step per
/// 1 s at first, from 1 to the knee of 30).
pub const DEFAULT_CAP: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_windows_within_ten_percent_settle_and_a_ramp_does_not() {
        let settle = Settle::new(DEFAULT_CAP);
        assert!(!settle.is_settled(&[]));
        assert!(
            !settle.is_settled(&[400, 400]),
            "two windows are not enough"
        );
        assert!(settle.is_settled(&[400, 400, 400]));
        assert!(settle.is_settled(&[0, 2, 100, 400, 380, 420]));
        // On 420 the edge is 44 apart (10 % + 2): 42 is within it, 45 is not.
        assert!(settle.is_settled(&[378, 400, 420]));
        assert!(!settle.is_settled(&[375, 400, 420]));
        // little on article, ~10 req/s more each second: 2 s windows climb 20 a window.
        assert!(!settle.is_settled(&[300, 320, 340, 360]));
        // A collapsed server serving nothing has settled too.
        assert!(settle.is_settled(&[400, 100, 0, 1, 0]));
    }
}
