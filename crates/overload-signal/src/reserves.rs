//! What each level leaves of a limit for the levels above it: the one mechanism every limit
//! of the workspace uses to shed from the bottom.

use std::fmt;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::sync::{AtomicU64, Ordering};

use crate::protocol::Criticality;

/// The share of a limit's capacity that each level may not take, left for the levels above
/// it: a request of level `c` is admitted only while, once it is, at least
/// `share(c) × capacity` is still free (in whole units, rounded up: a quarter of a burst of
/// 5 holds 2 units back, not 1). Shares fall with the level and the top level's is
/// zero, so a lower level is always refused before a higher one: this is the SRE rule "while
/// a lower level is still admitted, no higher level is rejected" in the form of Envoy's
/// per-priority thresholds and Netflix's partitioned limits.
///
/// A share is held back only **while a higher level is active** ([`RecentLevels`]): a
/// server whose traffic is all of one level (all `critical`, where nobody sets a level)
/// lends that level the whole limit, as before levels existed.
///
/// Defaults ([`Reserves::new`]):
///
/// | level | share held back |
/// |---|---|
/// | `sheddable` | 50 % |
/// | `sheddable-plus` | 25 % |
/// | `critical` | 10 % |
/// | `critical-plus` | 0 (always) |
///
/// ```
/// use overload_signal::criticality::Reserves;
/// use overload_signal::protocol::Criticality;
///
/// let reserves = Reserves::new();
/// assert_eq!(reserves.held_back(Criticality::Sheddable, 100), 50);
/// assert_eq!(reserves.held_back(Criticality::CriticalPlus, 100), 0);
///
/// let batch_heavy = Reserves::builder()
///     .share(Criticality::Sheddable, 0.8)
///     .build()?;
/// assert_eq!(batch_heavy.held_back(Criticality::Sheddable, 100), 80);
/// assert!(Reserves::builder().share(Criticality::Critical, 0.6).build().is_err(), "above sheddable-plus's");
/// # Ok::<(), overload_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq)]
pub struct Reserves {
    /// By [`Criticality::rank`].
    shares: [f64; 4],
    /// The same shares in billionths, for exact integer rounding: `0.1 × 30` is
    /// `3.0000000000000004` in `f64`, which rounded up would hold back 4 units, not 3.
    parts: [u64; 4],
}

/// The denominator of [`Reserves`]'s `parts`.
const PARTS: u64 = 1_000_000_000;

/// `share` in billionths, rounded to the nearest (`share` checked to be in `[0, 1)`).
fn parts_of(share: f64) -> u64 {
    // NOTE: share is in [0, 1), so the product is in [0, 1e9] and the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let parts = (share * PARTS as f64).round() as u64;
    parts.min(PARTS - 1)
}

impl Reserves {
    /// The defaults, listed on [`Reserves`].
    pub const fn new() -> Self {
        Self {
            shares: [0.5, 0.25, 0.1, 0.0],
            parts: [PARTS / 2, PARTS / 4, PARTS / 10, 0],
        }
    }

    /// No share held back from any level: the limit is blind to levels.
    pub const fn none() -> Self {
        Self {
            shares: [0.0; 4],
            parts: [0; 4],
        }
    }

    /// A builder that starts from the defaults.
    pub const fn builder() -> ReservesBuilder {
        ReservesBuilder {
            shares: Self::new().shares,
        }
    }

    /// The share of the capacity `level` may not take.
    pub const fn share(&self, level: Criticality) -> f64 {
        self.shares[level.rank()]
    }

    /// How much of `capacity` `level` may not take: its share, rounded up to a whole unit
    /// (so that "at least `share × capacity` free" holds in whole units), at most
    /// `capacity`. A share of zero holds nothing back.
    pub fn held_back(&self, level: Criticality, capacity: u64) -> u64 {
        let parts = u128::from(self.parts[level.rank()]);
        let held = (u128::from(capacity) * parts).div_ceil(u128::from(PARTS));
        // NOTE: parts < PARTS, so held <= capacity and fits in a u64.
        u64::try_from(held).map_or(capacity, |held| held.min(capacity))
    }

    /// Whether every level's share is zero.
    pub fn is_none(&self) -> bool {
        self.shares.iter().all(|&share| share == 0.0)
    }
}

impl Default for Reserves {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Reserves {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for level in Criticality::ALL {
            map.entry(&level.as_str(), &self.share(level));
        }
        map.finish()
    }
}

/// Builds [`Reserves`]; made by [`Reserves::builder`]. [`build`](Self::build) checks that
/// every share is in `[0, 1)`, that shares do not rise with the level, and that
/// `critical-plus`'s is zero.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ReservesBuilder {
    shares: [f64; 4],
}

impl ReservesBuilder {
    /// The share of a limit's capacity `level` may not take.
    pub const fn share(mut self, level: Criticality, share: f64) -> Self {
        self.shares[level.rank()] = share;
        self
    }

    /// Checks the shares.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first share that breaks a rule listed on
    /// [`ReservesBuilder`].
    pub fn build(self) -> Result<Reserves, ConfigError> {
        for (level, share) in Criticality::ALL.into_iter().zip(self.shares) {
            if !share.is_finite() {
                return Err(ConfigError::not_finite("share", share));
            }
            if !(0.0..1.0).contains(&share) {
                return Err(ConfigError::out_of_range(
                    "share",
                    share,
                    &format!("{level}'s share must be at least 0 and below 1"),
                ));
            }
        }
        if self.shares[Criticality::CriticalPlus.rank()] != 0.0 {
            return Err(ConfigError::out_of_range(
                "share",
                self.shares[Criticality::CriticalPlus.rank()],
                "critical-plus, the top level, has nobody to leave room for: its share is 0",
            ));
        }
        for pair in Criticality::ALL.windows(2) {
            let (lower, higher) = (pair[0], pair[1]);
            if self.shares[higher.rank()] > self.shares[lower.rank()] {
                return Err(ConfigError::out_of_range(
                    "share",
                    self.shares[higher.rank()],
                    &format!(
                        "{higher}'s share must not exceed {lower}'s ({}): a higher level is never refused before a lower one",
                        self.shares[lower.rank()]
                    ),
                ));
            }
        }
        Ok(Reserves {
            shares: self.shares,
            parts: self.shares.map(parts_of),
        })
    }
}

/// Which levels a limit has seen lately: a reserve is held back from a level only while a
/// level above it is active, so that a limit whose traffic is all of one level lends it the
/// whole capacity.
///
/// Lock-free: one relaxed load per level above the asking one, and a store at most once per
/// sixteenth of the window per level (so that a busy limit's cores do not fight over the
/// line).
pub struct RecentLevels {
    /// By rank: the clock's time (plus one; 0 is never) a request of the level was last seen.
    last_seen: [AtomicU64; 4],
    window: u64,
}

impl RecentLevels {
    /// How long a level counts as active after its last request, by default: 10 seconds,
    /// the overload layer's window. Long enough to span a level's gaps between bursts, short
    /// enough that a level gone quiet gives its room back quickly.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

    /// A tracker that counts a level as active for `window` after its last request (at
    /// least a millisecond).
    pub fn new(window: Duration) -> Self {
        #[allow(clippy::cast_possible_truncation)]
        let window = window.as_nanos().clamp(1_000_000, u128::from(u64::MAX)) as u64;
        Self {
            last_seen: Default::default(),
            window,
        }
    }

    /// Notes a request of `level` at `now` (the limit's clock, in nanoseconds).
    #[inline]
    pub fn note(&self, level: Criticality, now: u64) {
        let slot = &self.last_seen[level.rank()];
        let stamp = now.saturating_add(1);
        let seen = slot.load(Ordering::Relaxed);
        if seen == 0 || stamp.saturating_sub(seen) > self.window / 16 {
            slot.store(stamp, Ordering::Relaxed);
        }
    }

    /// Whether a level above `level` was seen within the window before `now`.
    #[inline]
    pub fn higher_active(&self, level: Criticality, now: u64) -> bool {
        self.last_seen[level.rank() + 1..].iter().any(|slot| {
            let seen = slot.load(Ordering::Relaxed);
            seen != 0 && now.saturating_add(1).saturating_sub(seen) <= self.window
        })
    }

    /// Whether a level below `level` was seen within the window before `now`.
    #[inline]
    pub fn lower_active(&self, level: Criticality, now: u64) -> bool {
        self.last_seen[..level.rank()].iter().any(|slot| {
            let seen = slot.load(Ordering::Relaxed);
            seen != 0 && now.saturating_add(1).saturating_sub(seen) <= self.window
        })
    }

    /// What `level` may not take of `capacity` at `now`: its [share](Reserves::held_back)
    /// while a higher level is active, else nothing.
    #[inline]
    pub fn held_back(
        &self,
        reserves: &Reserves,
        level: Criticality,
        capacity: u64,
        now: u64,
    ) -> u64 {
        if reserves.share(level) == 0.0 || !self.higher_active(level, now) {
            return 0;
        }
        reserves.held_back(level, capacity)
    }
}

impl Default for RecentLevels {
    fn default() -> Self {
        Self::new(Self::DEFAULT_WINDOW)
    }
}

impl fmt::Debug for RecentLevels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecentLevels")
            .field("window", &Duration::from_nanos(self.window))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Criticality::{Critical, CriticalPlus, Sheddable, SheddablePlus};

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn shares_must_fall_with_the_level_and_stay_under_one() {
        assert!(Reserves::builder().build().is_ok());
        assert!(Reserves::builder().share(Sheddable, 1.0).build().is_err());
        assert!(Reserves::builder().share(Sheddable, -0.1).build().is_err());
        assert!(
            Reserves::builder()
                .share(Sheddable, f64::NAN)
                .build()
                .is_err()
        );
        assert!(
            Reserves::builder()
                .share(CriticalPlus, 0.05)
                .build()
                .is_err()
        );
        assert!(
            Reserves::builder()
                .share(SheddablePlus, 0.6)
                .build()
                .is_err()
        );
        let flat = Reserves::builder()
            .share(Sheddable, 0.2)
            .share(SheddablePlus, 0.2)
            .share(Critical, 0.2)
            .build()
            .unwrap();
        assert_eq!(flat.held_back(SheddablePlus, 10), 2);
        assert!(Reserves::none().is_none() && !Reserves::new().is_none());
        let huge = Reserves::new().held_back(Critical, u64::MAX);
        assert!((u64::MAX / 11..=u64::MAX / 9).contains(&huge), "{huge}");
    }

    /// Regression: the share was rounded down, so a burst of 5 held 2 units back from
    /// `sheddable` (40 %, under its 50 %) and 0 from `critical` (under its 10 %): on the
    /// article model's bucket a `critical` stream at 60 % of the rate was refused 8.6 % of
    /// the time during a `sheddable` spike.
    #[test]
    fn a_share_is_held_back_in_whole_units_rounded_up_and_exactly() {
        let reserves = Reserves::new();
        assert_eq!(reserves.held_back(Sheddable, 5), 3, "2.5 rounded up");
        assert_eq!(reserves.held_back(SheddablePlus, 5), 2, "1.25 rounded up");
        assert_eq!(reserves.held_back(Critical, 5), 1, "0.5 rounded up");
        assert_eq!(reserves.held_back(CriticalPlus, 5), 0);
        // Whole products stay whole: 0.1 × 30 is 3.0000000000000004 in f64.
        assert_eq!(reserves.held_back(Critical, 30), 3);
        assert_eq!(reserves.held_back(Critical, 40), 4);
        assert_eq!(reserves.held_back(Sheddable, 100), 50);
        // Never the whole capacity but for a capacity of one, where a lower level waits
        // while a higher one is active.
        assert_eq!(reserves.held_back(Sheddable, 1), 1);
        assert_eq!(reserves.held_back(Sheddable, 0), 0);
        let thirds = Reserves::builder()
            .share(Sheddable, 1.0 / 3.0)
            .share(SheddablePlus, 1.0 / 3.0)
            .share(Critical, 0.0)
            .build()
            .unwrap();
        assert_eq!(thirds.held_back(Sheddable, 3), 1);
        assert_eq!(thirds.held_back(Sheddable, 300), 100);
        assert_eq!(thirds.held_back(Critical, 300), 0);
        let almost_all = Reserves::builder()
            .share(Sheddable, 0.999_999_999_9)
            .build()
            .unwrap();
        let huge = almost_all.held_back(Sheddable, u64::MAX);
        assert!(
            (u64::MAX - u64::MAX / 999_999_999..u64::MAX).contains(&huge),
            "{huge}"
        );
        assert_eq!(
            almost_all.held_back(Sheddable, 10),
            10,
            "9.99999999 rounded up"
        );
    }

    #[test]
    fn a_share_is_held_back_only_while_a_higher_level_is_active() {
        let reserves = Reserves::new();
        let recent = RecentLevels::new(Duration::from_secs(10));
        assert_eq!(
            recent.held_back(&reserves, Sheddable, 100, 0),
            0,
            "nobody seen"
        );
        recent.note(Sheddable, 0);
        assert_eq!(
            recent.held_back(&reserves, Sheddable, 100, SECOND),
            0,
            "only itself"
        );
        recent.note(Critical, 2 * SECOND);
        assert_eq!(recent.held_back(&reserves, Sheddable, 100, 3 * SECOND), 50);
        assert_eq!(
            recent.held_back(&reserves, SheddablePlus, 100, 3 * SECOND),
            25
        );
        assert_eq!(
            recent.held_back(&reserves, Critical, 100, 3 * SECOND),
            0,
            "none above"
        );
        assert_eq!(
            recent.held_back(&reserves, CriticalPlus, 100, 3 * SECOND),
            0
        );
        assert_eq!(recent.held_back(&reserves, Sheddable, 100, 12 * SECOND), 50);
        assert_eq!(
            recent.held_back(&reserves, Sheddable, 100, 12 * SECOND + 1),
            0,
            "the higher level went quiet a window ago"
        );
        recent.note(CriticalPlus, 20 * SECOND);
        assert_eq!(recent.held_back(&reserves, Critical, 100, 21 * SECOND), 10);
    }

    #[test]
    fn a_level_seen_at_time_zero_counts() {
        let recent = RecentLevels::default();
        recent.note(CriticalPlus, 0);
        assert!(recent.higher_active(Critical, 0));
        assert!(!recent.higher_active(CriticalPlus, 0));
    }
}
