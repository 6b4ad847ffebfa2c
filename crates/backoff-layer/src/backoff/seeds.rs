//! [`Seeds`]: where each request's random generator gets its seed.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{SeedableRng, TryRngCore};

/// A shared source of per-request seeds.
///
/// Each call to [`next_seed`](Seeds::next_seed) returns a different 64-bit seed (a counter,
/// keyed and scrambled by the SplitMix64 finaliser, which is a bijection: two calls on one
/// source never return the same seed before 2^64 calls). The retry layer seeds one small,
/// fast generator per request from it, so no two requests share a jitter sequence and no
/// lock is taken.
///
/// [`Seeds::from_os`] (the default) takes its key from the operating system, so sequences
/// differ between processes; [`Seeds::from_seed`] fixes the key for reproducible tests and
/// simulations. The seeds are not cryptographic and need not be.
#[derive(Debug)]
pub struct Seeds {
    key: u64,
    counter: AtomicU64,
}

impl Seeds {
    /// A source keyed by the operating system's random generator.
    ///
    /// Falls back to a key derived from the system clock and the address of a stack value if
    /// the operating system has no randomness to give (seeds then still differ per request).
    pub fn from_os() -> Self {
        let key = rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let local = 0u8;
            t ^ (std::ptr::from_ref(&local) as usize as u64)
        });
        Self::from_seed(key)
    }

    /// A reproducible source: the same `seed` gives the same sequence of per-request seeds.
    pub const fn from_seed(seed: u64) -> Self {
        Self {
            key: seed,
            counter: AtomicU64::new(0),
        }
    }

    /// The next seed; never the same twice for one source (until 2^64 calls).
    pub fn next_seed(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        splitmix64(n.wrapping_add(self.key.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// Another source, keyed by this one's key and `salt`: for a part of the layer (its
    /// throttle) whose draws must not shift the requests' seeds, yet be as reproducible.
    pub(crate) const fn derive(&self, salt: u64) -> Self {
        Self::from_seed(splitmix64(self.key ^ salt))
    }

    /// A new generator, seeded with [`next_seed`](Seeds::next_seed): what each request gets.
    pub fn rng(&self) -> SmallRng {
        SmallRng::seed_from_u64(self.next_seed())
    }
}

impl Default for Seeds {
    /// [`Seeds::from_os`].
    fn default() -> Self {
        Self::from_os()
    }
}

/// The SplitMix64 output function: a bijection on `u64` with good avalanche.
const fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
