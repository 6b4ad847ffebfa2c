//! [`Ethernet`]: IEEE 802.3's truncated binary exponential backoff, in whole slots.

use std::time::Duration;

use overload_core::ConfigError;
use rand::{Rng, RngCore};

use super::rules::positive;
use super::strategy::Backoff;

/// Ethernet's truncated binary exponential backoff: after collision `c` (`c = n + 1` before
/// retry `n`), wait a whole number of slots drawn uniformly from `0 ..= 2^min(c, 10) - 1`.
///
/// The expected wait after collision `c` is `(2^c - 1) / 2` slots (for `c <= 10`); the
/// largest is 1023 slots.
///
/// [`Ethernet::new`] uses a slot of 100 ms ([`DEFAULT_SLOT`](Self::DEFAULT_SLOT)).
/// IEEE 802.3 sizes its slot (512 bit times, 51.2 µs at 10 Mb/s) to the longest round trip
/// on the medium, the time a collision takes to be seen; for a request the matching unit
/// is the time a server takes to answer, and 100 ms is the article's service time (its
/// `MinDelay`). Waits are then 0 or 100 ms before the first retry, at most 102.3 s. The slot
/// is the only setting, so [`Ethernet::with_slot`] takes another one rather than a builder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ethernet {
    slot: Duration,
}

impl Ethernet {
    /// The exponent is truncated at 10, as in IEEE 802.3.
    pub const CEILING: u32 = 10;

    /// Default slot time: 100 ms, a request's round trip in the article's model (see the
    /// [type docs](Self)).
    pub const DEFAULT_SLOT: Duration = Duration::from_millis(100);

    /// A slot of 100 ms ([`DEFAULT_SLOT`](Self::DEFAULT_SLOT)).
    pub const fn new() -> Self {
        Self {
            slot: Self::DEFAULT_SLOT,
        }
    }

    /// A slot of `slot`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on the setting `slot` if it is zero, or so long that the largest
    /// wait, `slot * 1023`, does not fit in a [`Duration`].
    pub fn with_slot(slot: Duration) -> Result<Self, ConfigError> {
        positive("slot", slot)?;
        if slot.checked_mul((1 << Self::CEILING) - 1).is_none() {
            return Err(ConfigError::out_of_range(
                "slot",
                slot,
                "short enough that 1023 slots fit in a Duration",
            ));
        }
        Ok(Self { slot })
    }

    /// The slot time.
    pub const fn slot(&self) -> Duration {
        self.slot
    }

    /// The number of slots to wait before retry `retry`.
    pub fn slots(&self, retry: u32, rng: &mut dyn RngCore) -> u32 {
        let c = retry.saturating_add(1).min(Self::CEILING);
        rng.random_range(0..=(1u32 << c) - 1)
    }
}

impl Default for Ethernet {
    /// The same as [`Ethernet::new`]: a slot of 100 ms.
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff for Ethernet {
    fn next_delay(&self, retry: u32, _: Option<Duration>, rng: &mut dyn RngCore) -> Duration {
        // NOTE: cannot overflow: `with_slot` checked `slot * 1023` (and the default is
        // 100 ms), and slots() <= 1023.
        self.slot * self.slots(retry, rng)
    }

    fn max_delay(&self) -> Duration {
        self.slot * ((1 << Self::CEILING) - 1)
    }
}
