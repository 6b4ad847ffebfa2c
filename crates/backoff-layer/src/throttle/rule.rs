//! The rule: from the counts of one destination's window to its refusal probability.
//!
//! Pure functions of counts, so that every case is tested without a clock, a table or a
//! runtime; the table applies them at each tick.

/// The refusal probability in fixed point: `PROBABILITY_ONE` is 1.0. A request is refused
/// when a uniform 32-bit draw is below the probability.
pub(crate) const PROBABILITY_ONE: u64 = 1 << 32;

/// Outcomes of the attempts sent to one destination: answered (`accepts`) and failed
/// (`failures`). Requests the throttle refused are never in it: they were not sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SentCounts {
    pub(crate) accepts: u64,
    pub(crate) failures: u64,
}

impl SentCounts {
    pub(crate) const fn sent(self) -> u64 {
        self.accepts.saturating_add(self.failures)
    }

    pub(crate) const fn add(self, other: SentCounts) -> SentCounts {
        SentCounts {
            accepts: self.accepts.saturating_add(other.accepts),
            failures: self.failures.saturating_add(other.failures),
        }
    }
}

/// The settings the rule reads, checked by the builder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ThrottleRule {
    /// K: nothing is refused while the destination accepts at least `1 / K` of what is sent.
    pub(crate) multiplier: f64,
    /// The highest refusal probability: `1 - max_probability` of the requests always go.
    pub(crate) max_probability: f64,
    /// Failures the window must hold before a destination that is not throttled starts
    /// being throttled.
    pub(crate) min_failures: u64,
}

impl ThrottleRule {
    /// The refusal probability of a destination whose window holds `window` and whose
    /// probability is `current` (both in [`PROBABILITY_ONE`] units):
    ///
    /// - **no evidence, no change**: a window without a sent outcome keeps `current` (all
    ///   attempts still in flight, or nothing sent: refusals prove nothing);
    /// - **a threshold to start**: a destination not throttled (`current == 0`) starts only
    ///   once the window holds `min_failures` failures;
    /// - otherwise the SRE book's formula over what was sent,
    ///   `max(0, (sent - K * accepts) / (sent + 1))`, capped at `max_probability`.
    pub(crate) fn probability(&self, window: SentCounts, current: u64) -> u64 {
        let sent = window.sent();
        if sent == 0 {
            return current;
        }
        if current == 0 && window.failures < self.min_failures {
            return 0;
        }
        let raw = (sent as f64 - self.multiplier * window.accepts as f64) / (sent as f64 + 1.0);
        if raw.is_nan() || raw <= 0.0 {
            return 0;
        }
        to_units(raw.min(self.max_probability))
    }

    /// Whether the newest slot shows a destination that accepts what it is sent again: at
    /// least one accept, and at least K accepts per failure. When it does, the failures
    /// still counted from older slots are halved, so the window forgets an outage in a few
    /// ticks instead of a whole window.
    pub(crate) fn forgives(&self, newest: SentCounts) -> bool {
        newest.accepts >= 1 && newest.accepts as f64 >= self.multiplier * newest.failures as f64
    }
}

/// Shares a destination's refusal probability `probability` among the levels of
/// criticality, from the bottom, given how many requests each level offered (`offered`,
/// indexed by rank; attempts sent and requests refused): the refusals the probability
/// stands for, `probability * total`, go to the lowest level first, and to a level only once
/// every lower level is refused outright. Returns each level's probability.
///
/// - **One level, or no mix known**: that level's probability is `probability` itself,
///   exactly (and so is every level's when no level offered anything).
/// - **Strict order**: a level whose probability is below 1 has every higher level at 0;
///   a level that offered nothing is refused outright when a level above it is refused at
///   all, and not at all otherwise.
/// - The expected refusals are the same as one probability for all: the throttle sends as
///   much as the rule decides, it only chooses which.
pub(crate) fn split(probability: u64, offered: [u64; 4]) -> [u64; 4] {
    let total: u128 = offered.iter().map(|&n| u128::from(n)).sum();
    if probability == 0 || total == 0 {
        return [probability; 4];
    }
    let one = u128::from(PROBABILITY_ONE);
    // The refusals to place, in PROBABILITY_ONE units of requests.
    let mut left = u128::from(probability.min(PROBABILITY_ONE)) * total;
    let mut levels = [0; 4];
    for (level, &n) in levels.iter_mut().zip(&offered) {
        let n = u128::from(n);
        *level = if n == 0 {
            if left > 0 { PROBABILITY_ONE } else { 0 }
        } else if left >= n * one {
            left -= n * one;
            PROBABILITY_ONE
        } else {
            // NOTE: below `one`: `left < n * one`.
            let share = (left / n) as u64;
            left = 0;
            share
        };
    }
    levels
}

/// `probability` (within 0..=1) in [`PROBABILITY_ONE`] units.
pub(crate) fn to_units(probability: f64) -> u64 {
    // NOTE: the float-to-int cast saturates and maps NaN to 0.
    (probability.clamp(0.0, 1.0) * PROBABILITY_ONE as f64) as u64
}

/// `units` as a probability within 0..=1.
pub(crate) fn from_units(units: u64) -> f64 {
    units.min(PROBABILITY_ONE) as f64 / PROBABILITY_ONE as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RULE: ThrottleRule = ThrottleRule {
        multiplier: 2.0,
        max_probability: 0.9,
        min_failures: 10,
    };

    fn counts(accepts: u64, failures: u64) -> SentCounts {
        SentCounts { accepts, failures }
    }

    fn p(window: SentCounts, current: f64) -> f64 {
        from_units(RULE.probability(window, to_units(current)))
    }

    #[test]
    fn a_healthy_destination_is_never_throttled() {
        assert!(p(counts(1_000_000, 0), 0.0) <= 0.0);
        assert!(p(counts(1, 0), 0.0) <= 0.0);
        // Even while throttling: accepts only bring it to zero.
        assert!(p(counts(20, 0), 0.9) <= 0.0);
    }

    #[test]
    fn a_destination_accepting_half_or_more_is_never_throttled() {
        // K = 2: (sent - 2 * accepts) <= 0 while accepts >= sent / 2, failures or not.
        assert!(p(counts(80, 20), 0.0) <= 0.0, "20 % rejections");
        assert!(p(counts(50, 50), 0.0) <= 0.0, "50 % rejections");
        assert!(p(counts(50, 50), 0.5) <= 0.0, "and it reopens");
        assert!(p(counts(49, 51), 0.0) > 0.0, "just under half");
    }

    #[test]
    fn it_starts_only_with_enough_failures_and_then_follows_the_formula() {
        assert!(p(counts(0, 9), 0.0) <= 0.0, "9 failures: not yet");
        // 10 failures, 2 accepts: (12 - 4) / 13.
        assert!((p(counts(2, 10), 0.0) - 8.0 / 13.0).abs() < 1e-9);
        // Once throttling, few failures keep it going.
        assert!((p(counts(0, 2), 0.5) - 2.0 / 3.0).abs() < 1e-9);
        // (100 - 2 * 30) / 101.
        assert!((p(counts(30, 70), 0.0) - 40.0 / 101.0).abs() < 1e-9);
    }

    #[test]
    fn the_probability_is_capped_so_probes_always_go() {
        assert!((p(counts(0, 1_000), 0.0) - 0.9).abs() < 1e-9);
        assert!((p(counts(0, 1_000), 0.9) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn no_evidence_keeps_the_probability() {
        assert!(p(counts(0, 0), 0.0) <= 0.0);
        assert!((p(counts(0, 0), 0.9) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn forgiveness_needs_an_accept_and_k_accepts_per_failure() {
        assert!(!RULE.forgives(counts(0, 0)));
        assert!(!RULE.forgives(counts(0, 3)));
        assert!(RULE.forgives(counts(1, 0)));
        assert!(RULE.forgives(counts(2, 1)));
        assert!(!RULE.forgives(counts(3, 2)));
        // A destination answering half of what it is sent (a capacity limit at the SRE
        // book's equilibrium) is not forgiven.
        assert!(!RULE.forgives(counts(10, 10)));
    }

    #[test]
    fn refusals_go_to_the_lowest_levels_first() {
        let p = to_units(0.9);
        // One level: its probability is the destination's, exactly, whichever level.
        for rank in 0..4 {
            let mut offered = [0; 4];
            offered[rank] = 37;
            assert_eq!(split(p, offered)[rank], p);
        }
        assert_eq!(split(p, [0; 4]), [p; 4], "no mix known: as one level");
        assert_eq!(split(0, [5, 5, 5, 5]), [0; 4]);
        // Half sheddable, half critical, 90 %: every sheddable refused, 80 % of critical.
        let levels = split(p, [50, 0, 50, 0]);
        assert_eq!(levels[0], PROBABILITY_ONE);
        assert_eq!(
            levels[1], PROBABILITY_ONE,
            "not seen, below a refused level"
        );
        assert!((from_units(levels[2]) - 0.8).abs() < 1e-6);
        assert_eq!(levels[3], 0, "not seen, above every refusal");
        // 30 % with half sheddable: only sheddable, at 60 %.
        let levels = split(to_units(0.3), [50, 0, 50, 0]);
        assert!((from_units(levels[0]) - 0.6).abs() < 1e-6);
        assert_eq!(levels[1..], [0, 0, 0]);
    }

    proptest! {
        #[test]
        fn a_level_is_refused_only_once_every_lower_one_is_refused_outright(
            p in 0.0f64..1.0,
            offered in proptest::array::uniform4(0u64..1_000),
        ) {
            let units = to_units(p);
            let levels = split(units, offered);
            prop_assume!(offered.iter().any(|&n| n > 0), "no mix: every level at `units`");
            for (lower, higher) in (0..4).zip(1..4) {
                prop_assert!(levels[lower] >= levels[higher]);
                if levels[lower] < PROBABILITY_ONE {
                    prop_assert!(levels[higher..].iter().all(|&q| q == 0), "{levels:?}");
                }
            }
            // The same refusals in expectation, within rounding (one unit per level).
            let total: u128 = offered.iter().map(|&n| u128::from(n)).sum();
            if total > 0 {
                let placed: u128 = levels
                    .iter()
                    .zip(&offered)
                    .map(|(&q, &n)| u128::from(q) * u128::from(n))
                    .sum();
                let wanted = u128::from(units) * total;
                prop_assert!(placed <= wanted && wanted - placed <= total, "{placed} {wanted}");
            }
        }

        #[test]
        fn the_probability_stays_within_its_bounds(
            accepts in 0u64..1_000_000,
            failures in 0u64..1_000_000,
            current in 0.0f64..=0.9,
        ) {
            let q = p(counts(accepts, failures), current);
            prop_assert!((0.0..=0.9 + 1e-9).contains(&q));
            if failures <= accepts {
                prop_assert!(q <= 0.0);
            }
        }

        #[test]
        fn more_failures_never_lower_the_probability(
            accepts in 0u64..10_000,
            failures in 0u64..10_000,
            extra in 1u64..1_000,
        ) {
            let engaged = to_units(0.5);
            let before = RULE.probability(counts(accepts, failures), engaged);
            let after = RULE.probability(counts(accepts, failures + extra), engaged);
            prop_assert!(after >= before);
        }
    }
}
