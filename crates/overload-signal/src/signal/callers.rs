//! Who a request comes from, as far as the decision is concerned: the caller key
//! ([`CallerKey`], [`PeerIp`] by default), whose counters count (the layer's
//! [`Trust`](crate::Trust)), and
//! the retry pressure of each caller class, whose weight in the decision is bounded.
//!
//! See the [module docs](super#trust-what-callers-can-and-cannot-do) for the threat model.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::Arc;

use http::HeaderMap;
use http::request::Parts;

use super::StopRule;
use crate::histogram::AttemptHistogram;
use crate::protocol::{Attempt, RequestFields};
use overload_core::clock::Clock;
use overload_core::sync::{AtomicU64, Ordering};
use overload_core::window::Window;

/// How many classes caller keys are hashed into: 128. Requests without a key form one class
/// more.
pub(crate) const CLASSES: usize = 128;

/// The class of requests without a caller key.
pub(crate) const UNKEYED: u8 = CLASSES as u8;

/// Every class: the hashed ones and the unkeyed one.
const LANES: usize = CLASSES + 1;

/// Counters per bucket of the ledger: for each class, its requests (`2 * class`) and its
/// pressure (`2 * class + 1`: known retries, and requests answered with the stop signal).
const LEDGER_COUNTERS: usize = 2 * LANES;

/// Where a request's caller key comes from: the request head.
///
/// The [`OverloadSignalLayer`](crate::OverloadSignalLayer) hashes each request's key (with
/// a secret, per-process seed, so a caller cannot aim at a class) into one of
/// [`OverloadSignalLayer::CALLER_CLASSES`](crate::OverloadSignalLayer::CALLER_CLASSES)
/// classes, and bounds the weight any class carries in the decision. A key should be
/// something a caller cannot choose freely: the peer address ([`PeerIp`](super::PeerIp),
/// the default), a client address a trusted proxy wrote, an authenticated identity. A key
/// the caller picks (a header it sets) lets one caller spread its requests over every class,
/// which makes it as strong as many callers. Requests for which the key returns none share
/// one class more; the layer counts them (`overload_signal_unkeyed_requests_total`) and logs
/// them at `WARN`, at once and then at most once a minute.
///
/// Implemented by every closure `Fn(&Parts) -> Option<K>` whose key `K` is [`Hash`], by
/// [`PeerIp`](super::PeerIp), and by `ratelimit-layer`'s `ClientIp` and `HeaderKey`, so a
/// rate limit and this layer can key requests alike (one `ClientIp`, trusted proxies
/// included, passed to both). A closure needs its argument's type written out
/// (`|parts: &Parts| ...`).
///
/// **Why a trait of its own**, beside `ratelimit-layer`'s `KeyExtractor` (which the same
/// types implement) and its `RedisKey`: this layer keeps no key. It feeds a request's key
/// to a keyed hash that picks one of its caller classes, once, and forgets it; so the trait
/// asks for nothing but [`Hash`], is object-safe (the layer holds it as
/// `Arc<dyn CallerKey>`, and its type names no key), and has no policy for a missing key
/// (such requests share one class, counted and logged). A rate limit stores a bucket per
/// key: its `KeyExtractor` needs an owned key with `Eq`, a borrowed form to look a known key
/// up without allocating, and a policy for a request without one. A Redis-backed limit
/// names each key in Redis: its `RedisKey` writes bytes that every process of a fleet writes
/// alike, which a `Hash` (seeded per process) cannot give. One trait for all three would
/// force the bounds of the strictest on each.
///
/// ```
/// use http::request::Parts;
/// use overload_signal::OverloadSignalLayer;
///
/// /// Put in the request's extensions by an mTLS or token authentication layer.
/// #[derive(Clone)]
/// struct Identity(String);
///
/// let layer = OverloadSignalLayer::builder()
///     .key_by(|parts: &Parts| parts.extensions.get::<Identity>().map(|id| id.0.clone()))
///     .build()?;
/// # drop(layer);
/// # Ok::<(), overload_core::ConfigError>(())
/// ```
pub trait CallerKey: Send + Sync + 'static {
    /// Feeds the request's caller key to `state` and returns `true`, or returns `false`
    /// when the request has no key.
    fn hash_key(&self, parts: &Parts, state: &mut dyn Hasher) -> bool;
}

impl<F, K> CallerKey for F
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: Hash,
{
    fn hash_key(&self, parts: &Parts, mut state: &mut dyn Hasher) -> bool {
        match self(parts) {
            Some(key) => {
                key.hash(&mut state);
                true
            }
            None => false,
        }
    }
}

/// How caller keys are hashed into classes: with random keys, so a caller cannot aim at a
/// class, or (in tests) with fixed ones, so every run puts callers in the same classes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyHashing {
    /// The accumulator's start and the finishing multiplier: 128 secret bits.
    keys: [u64; 2],
}

impl KeyHashing {
    /// Keys drawn at random for each layer (from std's `RandomState`, which the OS seeds).
    pub(crate) fn random() -> Self {
        let random = RandomState::new();
        Self {
            keys: [
                random.hash_one(0x0c1a_55e5_u64),
                random.hash_one(0x5eed_u64),
            ],
        }
    }

    /// Fixed keys from `seed`.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn seeded(seed: u64) -> Self {
        Self {
            keys: [splitmix64(seed), splitmix64(seed ^ 0x9E37_79B9_7F4A_7C15)],
        }
    }

    fn hasher(self) -> ClassHasher {
        ClassHasher {
            acc: self.keys[0],
            key: self.keys[1] | 1,
        }
    }
}

/// The hasher of caller keys: a keyed folded multiply (the construction of foldhash and
/// ahash's fallback), a few instructions per word where SipHash-1-3 takes a hundred.
///
/// NOTE: not a cryptographic hash, and not meant to be: the secret keys (128 bits, random
/// per layer) are what keeps a caller from aiming at a class, and all a class decides is
/// which callers' requests are weighed together. A caller who could predict classes would
/// gain little: its key is its address, which it does not choose freely, and the weight of a
/// class is capped whatever it sends.
pub(crate) struct ClassHasher {
    acc: u64,
    key: u64,
}

/// The high and low halves of the 128-bit product, xored: every input bit reaches the low
/// bits of the result.
#[inline]
fn folded_multiply(x: u64, y: u64) -> u64 {
    let full = u128::from(x) * u128::from(y);
    (full as u64) ^ ((full >> 64) as u64)
}

/// The multiplier of each absorbed word: the fractional bits of pi (foldhash's first seed).
const ABSORB: u64 = 0x243F_6A88_85A3_08D3;

impl ClassHasher {
    #[inline]
    fn absorb(&mut self, word: u64) {
        self.acc = folded_multiply(self.acc ^ word, ABSORB);
    }
}

impl Hasher for ClassHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.absorb(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.absorb(u64::from(n));
    }

    #[inline]
    fn write_u16(&mut self, n: u16) {
        self.absorb(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.absorb(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.absorb(n);
    }

    #[inline]
    fn write_u128(&mut self, n: u128) {
        self.absorb(n as u64);
        self.absorb((n >> 64) as u64);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.absorb(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        folded_multiply(self.acc, self.key)
    }
}

/// SplitMix64: one well-mixed word from any input (for fixed test keys).
#[cfg(any(test, feature = "test-util"))]
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What the layer learnt about a request's caller when it recorded it, for the decision on
/// its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The caller class.
    lane: u8,
    /// Whether the request was a known retry from a trusted caller.
    pub(crate) retry: bool,
}

/// The clock of the histogram, read through it, so that the ledger and the histogram agree
/// on every bucket.
struct HistogramClock<C: Clock>(AttemptHistogram<C>);

impl<C: Clock> Clock for HistogramClock<C> {
    fn now(&self) -> u64 {
        self.0.clock().now()
    }
}

/// The retry pressure of each caller class over the histogram's window, and what the
/// decision needs from it.
pub(crate) struct CallerLedger<C: Clock> {
    window: Window<LEDGER_COUNTERS, HistogramClock<C>>,
    hashing: KeyHashing,
    /// The caller key: `None` for the default, [`PeerIp`](super::PeerIp), which the caller
    /// of [`identify_head`](Self::identify_head) hashes from the request's extensions,
    /// without a call through `dyn` and without the request taken apart.
    key: Option<Arc<dyn CallerKey>>,
    /// The last per-caller verdict of the server-wide rule (see `CallerVerdict`).
    verdict: AtomicU64,
}

impl<C: Clock> CallerLedger<C> {
    pub(crate) fn new(
        histogram: &AttemptHistogram<C>,
        key: Option<Arc<dyn CallerKey>>,
        hashing: KeyHashing,
    ) -> Self {
        let window = Window::<LEDGER_COUNTERS>::builder()
            .window(histogram.window())
            .slots(histogram.buckets())
            .clock(HistogramClock(histogram.clone()))
            .build()
            .expect("the histogram's geometry is valid for a window");
        Self {
            window,
            hashing,
            key,
            verdict: AtomicU64::new(0),
        }
    }

    /// Whether the caller key needs the request's [`Parts`] (a key of the user's own), where
    /// the default, [`PeerIp`](super::PeerIp), reads its extensions only: see [`identify_head`](Self::identify_head).
    #[inline]
    pub(crate) const fn key_reads_parts(&self) -> bool {
        self.key.is_some()
    }

    /// The request's attempt counter as far as the decision goes (unknown when it claims a
    /// retry and its caller is not `trusted`) and its caller class ([`UNKEYED`] without a
    /// key: the caller reports it), from its headers and extensions, and its `parts` if the
    /// caller took it apart: a caller that did not asks
    /// [`key_reads_parts`](Self::key_reads_parts) first (without `parts`, a key of the
    /// user's own finds no key). `grpc`: the request is gRPC (or gRPC-Web), whose own
    /// counter is read too; `fields`: the counters the request may carry; `default_key`:
    /// what [`PeerIp`](super::PeerIp) writes for the request (the default key).
    #[inline]
    pub(crate) fn identify_head(
        &self,
        headers: &HeaderMap,
        parts: Option<&Parts>,
        grpc: bool,
        fields: RequestFields,
        trusted: impl FnOnce() -> bool,
        default_key: impl FnOnce(&mut ClassHasher) -> bool,
    ) -> (Attempt, u8) {
        let attempt = Attempt::from_fields(headers, grpc, fields);
        // NOTE: only a claim to be a retry can raise the pressure, so only then is the
        // caller's trust asked (a few header and extension look-ups): first tries, most of
        // a server's traffic, skip it, whoever sends them.
        let attempt = if attempt.is_retry() && !trusted() {
            Attempt::Unknown
        } else {
            attempt
        };
        let mut state = self.hashing.hasher();
        let keyed = match (&self.key, parts) {
            // NOTE: the default key, written by the caller straight into the hasher.
            (None, _) => default_key(&mut state),
            (Some(key), Some(parts)) => key.hash_key(parts, &mut state),
            (Some(_), None) => {
                debug_assert!(false, "a key of the user's own needs the request's parts");
                false
            }
        };
        let lane = if keyed {
            // NOTE: CLASSES is a power of two, and the finishing multiply folds the high half
            // of the product into the low bits, so the low bits are as good as any.
            ((state.finish() as usize) & (CLASSES - 1)) as u8
        } else {
            UNKEYED
        };
        (attempt, lane)
    }

    /// Records a request of caller class `lane` in bucket `bucket`.
    #[inline]
    pub(crate) fn record(&self, bucket: u64, lane: u8, retry: bool) -> Caller {
        let lane_index = usize::from(lane);
        self.window.add(bucket, 2 * lane_index, 1);
        if retry {
            self.window.add(bucket, 2 * lane_index + 1, 1);
        }
        Caller { lane, retry }
    }

    /// Records that a request of `caller`'s class, not a retry, was answered with the stop
    /// signal: pressure that stands for the retry it held back.
    pub(crate) fn record_stopped(&self, bucket: u64, caller: Caller) {
        self.window.add(bucket, 2 * usize::from(caller.lane) + 1, 1);
    }

    /// The requests of `caller`'s class in the window ending at `bucket`, and their retry
    /// pressure (`None` when there are none).
    pub(crate) fn class_pressure(&self, bucket: u64, caller: Caller) -> (u64, Option<f64>) {
        let lane = usize::from(caller.lane);
        let requests = self.window.added(bucket, 2 * lane);
        let pressed = self.window.added(bucket, 2 * lane + 1).min(requests);
        // u64 -> f64 loses precision only above 2^53 requests.
        let share = (requests > 0).then(|| pressed as f64 / requests as f64);
        (requests, share)
    }

    /// The per-caller retry pressure of the window ending at `bucket`: see
    /// [`per_caller_pressure`].
    pub(crate) fn per_caller_pressure(&self, bucket: u64) -> Option<f64> {
        let counts = self.window.counts(bucket);
        let all = counts.added_all();
        let lanes: [(u64, u64); LANES] = std::array::from_fn(|l| (all[2 * l], all[2 * l + 1]));
        per_caller_pressure(&lanes)
    }

    /// Whether the per-caller retry pressure of the window ending at `bucket`, which holds
    /// `requests` requests, is above `rule`'s threshold.
    ///
    /// NOTE: summing every class over the window reads `stripes * buckets * 258` words, up
    /// to tens of microseconds on a many-core server; in a storm every rejection asks. The
    /// verdict is kept and reused while the window stays in the same bucket and has grown by
    /// less than a sixteenth. That bounds how much traffic arrives unseen, not how far the
    /// figure moves: new retries concentrated on a few classes can move the per-caller
    /// pressure by more than a sixteenth (800 retries on 8 of 128 classes of 100 requests
    /// each move it by about 3 points), and the stale verdict then holds for the rest of the
    /// bucket (1 s by default). The next bucket, or more growth, reads the window again.
    pub(crate) fn per_caller_fires(&self, rule: &StopRule, bucket: u64, requests: u64) -> bool {
        let kept = CallerVerdict::unpack(self.verdict.load(Ordering::Relaxed));
        if let Some(fires) = kept.reuse(bucket, requests) {
            return fires;
        }
        let fires = self
            .per_caller_pressure(bucket)
            .is_some_and(|share| share > rule.retry_share());
        let fresh = CallerVerdict::new(bucket, requests, fires);
        self.verdict.store(fresh.pack(), Ordering::Relaxed);
        fires
    }
}

impl<C: Clock> fmt::Debug for CallerLedger<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallerLedger")
            .field("classes", &CLASSES)
            .finish_non_exhaustive()
    }
}

/// A kept per-caller verdict, packed in one word: the bucket's number modulo 2^32 (high 32
/// bits), the window's requests when it was computed (31 bits, saturating; 0 means none
/// kept) and the verdict (lowest bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CallerVerdict {
    bucket: u32,
    requests: u64,
    fires: bool,
}

impl CallerVerdict {
    const REQUESTS_MAX: u64 = (1 << 31) - 1;

    fn new(bucket: u64, requests: u64, fires: bool) -> Self {
        Self {
            bucket: bucket as u32,
            requests: requests.min(Self::REQUESTS_MAX),
            fires,
        }
    }

    fn pack(self) -> u64 {
        (u64::from(self.bucket) << 32) | (self.requests << 1) | u64::from(self.fires)
    }

    fn unpack(word: u64) -> Self {
        Self {
            bucket: (word >> 32) as u32,
            requests: (word >> 1) & Self::REQUESTS_MAX,
            fires: word & 1 == 1,
        }
    }

    /// The kept verdict, if it still holds for a window ending at `bucket` with `requests`.
    fn reuse(self, bucket: u64, requests: u64) -> Option<bool> {
        let requests = requests.min(Self::REQUESTS_MAX);
        let same_bucket = self.bucket == bucket as u32;
        let grown = requests.checked_sub(self.requests)?;
        (self.requests > 0 && same_bucket && grown <= self.requests / 16).then_some(self.fires)
    }
}

/// The retry pressure of a window over caller classes, each given as `(requests, pressure)`,
/// with each class's weight capped: `None` when no class has a request.
///
/// Each class with requests weighs its requests, capped at the **median** of the classes'
/// requests (the lower median: of two classes, the smaller), and brings its own pressure
/// (its pressure count over its requests): the result is the weighted mean of the classes'
/// pressures. So:
///
/// - one class alone (every request from one caller, or none keyed) gives its own pressure,
///   the plain figure;
/// - classes of similar traffic weigh alike, and the result is close to the plain figure;
/// - the result is a mean of the classes' own pressures, so volume alone cannot raise it
///   above the highest of them;
/// - a class weighs no more than the median class, however much it sends, and at least half
///   of the classes weigh that much: of `n` classes in use, one class's pressure moves the
///   result by at most `2/(n + 1)` (`1/n` when the classes' traffic is even), and `m`
///   classes' by at most about `m` times that.
pub(crate) fn per_caller_pressure(lanes: &[(u64, u64)]) -> Option<f64> {
    let mut volumes = [0u64; LANES];
    let mut used = 0;
    for &(requests, _) in lanes.iter().filter(|(requests, _)| *requests > 0) {
        volumes[used] = requests;
        used += 1;
    }
    if used == 0 {
        return None;
    }
    let volumes = &mut volumes[..used];
    let (_, &mut median, _) = volumes.select_nth_unstable((used - 1) / 2);
    let (mut pressed, mut weight) = (0.0, 0.0);
    for &(requests, pressure) in lanes.iter().filter(|(requests, _)| *requests > 0) {
        // u64 -> f64 loses precision only above 2^53 requests.
        let w = requests.min(median) as f64;
        pressed += w * (pressure.min(requests) as f64 / requests as f64);
        weight += w;
    }
    Some(pressed / weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn one_class_gives_its_own_pressure() {
        assert_eq!(per_caller_pressure(&[]), None);
        assert_eq!(per_caller_pressure(&[(0, 0), (0, 0)]), None);
        assert!(close(per_caller_pressure(&[(1000, 70)]), 0.07));
        assert!(close(
            per_caller_pressure(&[(0, 0), (1000, 70), (0, 0)]),
            0.07
        ));
        // Pressure above the requests (stops counted in a later bucket) is clamped.
        assert!(close(per_caller_pressure(&[(10, 12)]), 1.0));
    }

    #[test]
    fn even_classes_give_the_plain_pressure() {
        let lanes: Vec<_> = (0..64)
            .map(|i| (100, if i % 10 == 0 { 50 } else { 0 }))
            .collect();
        // 7 classes at 50 %, 57 at 0: 350 of 6400.
        assert!(close(per_caller_pressure(&lanes), 350.0 / 6400.0));
    }

    #[test]
    fn a_loud_class_weighs_as_much_as_the_median_one() {
        // Finding 1 of the issue, per second: 700 first tries from 63 callers, 60 forged
        // retries from one. Plain pressure 60 / 760 = 7.9 %; per caller 1/64 = 1.6 %.
        let mut lanes = vec![(11, 0); 63];
        lanes.push((60, 60));
        assert!(close(per_caller_pressure(&lanes), 11.0 / (64.0 * 11.0)));
        // Sending ten or a thousand times more changes nothing.
        lanes[63] = (600_000, 600_000);
        assert!(close(per_caller_pressure(&lanes), 1.0 / 64.0));
        // Of two callers the smaller sets the cap: one of two is half.
        assert!(close(per_caller_pressure(&[(1000, 0), (60, 60)]), 0.5));
    }

    #[test]
    fn a_storm_from_every_class_is_seen_whatever_their_volumes() {
        // Budget-keeping clients in a full outage: about 9 % retries everywhere.
        let lanes: Vec<_> = (1..=64u64).map(|i| (100 * i, 9 * i)).collect();
        assert!(close(per_caller_pressure(&lanes), 0.09));
    }

    proptest::proptest! {
        /// Whatever the other classes and however much one class sends, all of its requests
        /// being retries rather than none moves the result by at most 2/(n + 1), `n` the
        /// classes in use.
        #[test]
        fn one_class_s_pressure_moves_the_result_by_at_most_2_over_n_plus_1(
            lanes in proptest::collection::vec((1u64..1000, 0u64..1000), 1..64),
            volume in 1u64..1_000_000,
        ) {
            let mut lanes: Vec<_> = lanes.into_iter().map(|(n, p)| (n, p.min(n))).collect();
            lanes.push((volume, 0));
            let honest = per_caller_pressure(&lanes).unwrap();
            lanes.last_mut().unwrap().1 = volume;
            let forged = per_caller_pressure(&lanes).unwrap();
            let n = lanes.len() as f64;
            proptest::prop_assert!(forged >= honest - 1e-9);
            proptest::prop_assert!(forged - honest <= 2.0 / (n + 1.0) + 1e-9,
                "{honest} -> {forged} with {n} classes");
        }

        /// The result is a mean of the classes' own pressures: within their range.
        #[test]
        fn the_result_is_within_the_classes_pressures(
            lanes in proptest::collection::vec((1u64..10_000, 0u64..10_000), 1..65),
        ) {
            let lanes: Vec<_> = lanes.into_iter().map(|(n, p)| (n, p.min(n))).collect();
            let share = per_caller_pressure(&lanes).unwrap();
            let shares = lanes.iter().map(|&(n, p)| p as f64 / n as f64);
            let lo = shares.clone().fold(f64::INFINITY, f64::min);
            let hi = shares.fold(0.0, f64::max);
            proptest::prop_assert!(share >= lo - 1e-9 && share <= hi + 1e-9);
        }
    }

    /// The class hash spreads keys evenly: 12 800 addresses over 128 classes (100 each on
    /// average) leave no class under half or over twice the mean, with random keys or seeded
    /// ones; and two layers' random keys put one address in different classes.
    /// The default key, read from the extensions without `dyn` (and without the request's
    /// parts), puts every request in the class `PeerIp` given as a key of the user's own
    /// puts it in: IPv4, IPv6, IPv4-mapped, a resolved client beside its peer, and none.
    #[tokio::test]
    async fn the_default_key_classes_callers_as_peer_ip_through_dyn() {
        use super::super::PeerIp;
        use std::net::SocketAddr;
        let histogram = AttemptHistogram::new();
        let hashing = KeyHashing::seeded(11);
        let default = CallerLedger::new(&histogram, None, hashing);
        let given = CallerLedger::new(&histogram, Some(Arc::new(PeerIp)), hashing);
        assert!(!default.key_reads_parts());
        assert!(given.key_reads_parts());
        let request = |peer: Option<&str>, client: Option<&str>| {
            let mut request = http::Request::new(());
            if let Some(peer) = peer {
                request
                    .extensions_mut()
                    .insert(peer.parse::<SocketAddr>().unwrap());
            }
            if let Some(client) = client {
                request
                    .extensions_mut()
                    .insert(super::super::ClientAddr::new(client.parse().unwrap()));
            }
            request.into_parts().0
        };
        let lane = |ledger: &CallerLedger<_>, parts: &Parts, whole: bool| {
            let parts_given = whole.then_some(parts);
            let (_, lane) = ledger.identify_head(
                &parts.headers,
                parts_given,
                false,
                RequestFields::ALL,
                || true,
                |state| PeerIp::hash_extensions(&parts.extensions, state),
            );
            lane
        };
        let mut lanes = Vec::new();
        for (peer, client) in [
            (Some("192.0.2.7:1"), None),
            (Some("198.51.100.200:1"), None),
            (Some("[2001:db8:1:2::7]:1"), None),
            (Some("[::ffff:192.0.2.9]:1"), None),
            (Some("10.0.0.2:1"), Some("203.0.113.5")),
            (None, Some("2001:db8:9::1")),
            (None, None),
        ] {
            let parts = request(peer, client);
            let expected = lane(&given, &parts, true);
            assert_eq!(
                lane(&default, &parts, true),
                expected,
                "{peer:?} {client:?}"
            );
            assert_eq!(
                lane(&default, &parts, false),
                expected,
                "{peer:?} {client:?}"
            );
            lanes.push(expected);
        }
        assert_eq!(lanes[0], lanes[3], "one /24, mapped or not");
        assert_eq!(lanes[6], UNKEYED);
        assert!(lanes[..6].iter().all(|&lane| lane != UNKEYED), "{lanes:?}");
    }

    #[test]
    fn caller_classes_are_spread_evenly_and_keyed() {
        use std::net::{IpAddr, Ipv4Addr};
        let class = |hashing: KeyHashing, ip: IpAddr| {
            let mut h = hashing.hasher();
            ip.hash(&mut h);
            (h.finish() as usize) & (CLASSES - 1)
        };
        for hashing in [KeyHashing::random(), KeyHashing::seeded(7)] {
            let mut counts = [0u32; CLASSES];
            for i in 0..12_800u32 {
                let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
                counts[class(hashing, ip)] += 1;
            }
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(*lo >= 50 && *hi <= 200, "{lo}..{hi}");
        }
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
        let differ = (0..16)
            .filter(|_| class(KeyHashing::random(), ip) != class(KeyHashing::random(), ip))
            .count();
        assert!(differ >= 12, "{differ} of 16 pairs of layers disagree");
        assert_eq!(
            class(KeyHashing::seeded(3), ip),
            class(KeyHashing::seeded(3), ip)
        );
    }

    #[test]
    fn a_kept_verdict_holds_within_a_bucket_and_a_sixteenth() {
        let v = CallerVerdict::new(7, 1600, true);
        assert_eq!(CallerVerdict::unpack(v.pack()), v);
        assert_eq!(v.reuse(7, 1600), Some(true));
        assert_eq!(v.reuse(7, 1700), Some(true));
        assert_eq!(v.reuse(7, 1701), None, "grown by more than a sixteenth");
        assert_eq!(v.reuse(8, 1600), None, "another bucket");
        assert_eq!(
            v.reuse(7, 1599),
            None,
            "fewer requests: not the same window"
        );
        // Nothing kept yet.
        assert_eq!(CallerVerdict::unpack(0).reuse(0, 0), None);
        assert_eq!(CallerVerdict::unpack(0).reuse(0, 5), None);
        // Small windows are judged afresh on every new request.
        assert_eq!(CallerVerdict::new(3, 15, false).reuse(3, 16), None);
        let big = CallerVerdict::new(u64::MAX, u64::MAX, false);
        assert_eq!(CallerVerdict::unpack(big.pack()), big);
    }
}
