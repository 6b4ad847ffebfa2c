//! Criticality in the adaptive limit: the part of the limit each level may take, and the
//! per-level counts of admissions.
//!
//! A request of level `c` is admitted only while, once it is, the requests in flight (of
//! every level) are at most `limit − held_back(c)`, where `held_back(c)` is the level's
//! [`Reserves`] share of the limit while a higher level is active ([`RecentLevels`]), and
//! 0 otherwise. A lower level is therefore always refused before a higher one, and traffic
//! of one level is limited exactly as without levels.

use overload_core::sync::{AtomicBool, Ordering, StripedCounter};
use overload_signal::criticality::{RecentLevels, Reserves};
use overload_signal::protocol::Criticality;

/// The levels' shares of one adaptive limit, which levels were active lately, and the
/// admissions counted per level until the tick adds them to their counters.
pub(super) struct Levels {
    reserves: Reserves,
    /// Whether every share is zero: then nothing is held back and nothing is noted.
    blind: bool,
    recent: RecentLevels,
    /// Whether a request was turned away at its level's part of the limit, below the limit
    /// itself, since the window started: that level used all the limit it may take. See
    /// [`AdaptiveWindowStats::level_full`](super::controller::AdaptiveWindowStats).
    level_full: AtomicBool,
    /// Admitted requests by [`Criticality::rank`], not yet added to the admitted counters.
    admitted: [StripedCounter; 4],
}

impl Levels {
    pub(super) fn new(reserves: Reserves) -> Self {
        Self {
            reserves,
            blind: reserves.is_none(),
            recent: RecentLevels::default(),
            level_full: AtomicBool::new(false),
            admitted: std::array::from_fn(|_| StripedCounter::new()),
        }
    }

    /// Notes a request of `level` at `now` (clock nanoseconds) and returns how much of
    /// `limit` it may not take: its share while a higher level is active, else 0.
    #[inline]
    pub(super) fn held_back(&self, level: Criticality, limit: usize, now: u64) -> usize {
        if self.blind {
            return 0;
        }
        self.recent.note(level, now);
        let held = self
            .recent
            .held_back(&self.reserves, level, limit as u64, now);
        // NOTE: at most `limit` (a share is under 1), so it fits.
        usize::try_from(held).unwrap_or(limit)
    }

    /// A request was turned away at its level's part of the limit, with room left above it.
    #[inline]
    pub(super) fn turned_away_below_the_limit(&self) {
        // NOTE: read first: under a flood of a low level every rejection would otherwise
        // write the shared cache line.
        if !self.level_full.load(Ordering::Relaxed) {
            self.level_full.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a level was turned away at its part of the limit since the last call; starts
    /// the next window.
    pub(super) fn take_level_full(&self) -> bool {
        self.level_full.swap(false, Ordering::Relaxed)
    }

    /// Counts an admission of `level` on the calling core's stripe.
    #[inline]
    pub(super) fn count_admitted(&self, level: Criticality) {
        self.admitted[level.rank()].add(1);
    }

    /// The admissions counted since the last call, by rank.
    pub(super) fn take_admitted(&self) -> [u64; 4] {
        std::array::from_fn(|rank| self.admitted[rank].take())
    }

    pub(super) const fn reserves(&self) -> &Reserves {
        &self.reserves
    }
}

impl std::fmt::Debug for Levels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Levels")
            .field("reserves", &self.reserves)
            .field("recent", &self.recent)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use overload_signal::protocol::Criticality::{Critical, CriticalPlus, Sheddable};

    #[test]
    fn a_share_is_held_back_only_while_a_higher_level_is_active() {
        let levels = Levels::new(Reserves::new());
        assert_eq!(levels.held_back(Sheddable, 40, 0), 0, "only itself");
        assert_eq!(levels.held_back(Critical, 40, 1), 0, "none above");
        assert_eq!(levels.held_back(Sheddable, 40, 2), 20, "half of 40");
        assert_eq!(levels.held_back(Critical, 40, 3), 0);
        assert_eq!(levels.held_back(CriticalPlus, 40, 4), 0);
        assert_eq!(levels.held_back(Critical, 40, 5), 4, "a tenth of 40");
    }

    #[test]
    fn no_reserves_hold_nothing_back() {
        let levels = Levels::new(Reserves::none());
        levels.held_back(CriticalPlus, 40, 0);
        assert_eq!(levels.held_back(Sheddable, 40, 1), 0);
        assert_eq!(levels.held_back(Critical, 40, 2), 0);
    }

    #[test]
    fn admissions_are_counted_per_level_and_taken_once() {
        let levels = Levels::new(Reserves::new());
        levels.count_admitted(Sheddable);
        levels.count_admitted(Sheddable);
        levels.count_admitted(CriticalPlus);
        assert_eq!(levels.take_admitted(), [2, 0, 0, 1]);
        assert_eq!(levels.take_admitted(), [0; 4]);
        assert!(!levels.take_level_full());
        levels.turned_away_below_the_limit();
        assert!(levels.take_level_full());
        assert!(!levels.take_level_full(), "one window's");
    }
}
