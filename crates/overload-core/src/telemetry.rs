//! How every layer of the workspace reports itself: a name, metric handles registered on
//! first use and kept, state changes logged once, and gauges kept true while no request
//! comes.
//!
//! - [`LayerName`]: what a layer calls itself. Every metric of the workspace carries it as
//!   the label [`NAME_LABEL`] (`name`), and every state change it logs carries it as the
//!   field `name`, so two retry layers for two downstreams, or a rate limit and an adaptive
//!   limit in one process, are told apart. Default: `"default"`: name your layers when a
//!   process has more than one of a kind.
//! - [`LazyMetrics`]: a layer's metric handles ([`MetricSet`]), registered with the
//!   recorder on the layer's **first request**, not when it is built, so a recorder
//!   installed after the layer (before traffic) sees every metric; then kept, so a request
//!   costs no registry lookup.
//! - [`Episode`]: a condition a layer enters and leaves (a limit rejecting, the stop signal
//!   engaged, Redis away, the retry budget refusing), so that the layer logs once when it
//!   starts (`WARN`) and once when it ends (`INFO`), never once per request.
//! - [`LogThrottle`]: a misconfiguration that requests keep showing (a missing key),
//!   logged again at most once per interval with the count of what it skipped, never once
//!   and then forgotten.
//! - [`Ticker`]: a task that wakes a layer's state at a fixed period for as long as the
//!   layer lives, so gauges that describe a window fall back to zero when traffic stops and
//!   an episode ends when its condition has not been seen for a while; started by a layer's
//!   first request, and again by a later one when the runtime that ran it has shut down.
//!
//! ```
//! use metrics::Counter;
//! use overload_core::telemetry::{LayerName, LazyMetrics, MetricSet, NAME_LABEL};
//!
//! struct Handles {
//!     requests: Counter,
//! }
//!
//! impl MetricSet for Handles {
//!     fn register(name: &LayerName) -> Self {
//!         Self { requests: metrics::counter!("my_layer_requests_total", NAME_LABEL => name.label()) }
//!     }
//! }
//!
//! let metrics = LazyMetrics::<Handles>::new(LayerName::new("payments")?);
//! // Nothing is registered yet; the first request registers, later ones reuse the handles.
//! metrics.get().requests.increment(1);
//! # Ok::<(), overload_core::ConfigError>(())
//! ```

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

mod ticker;

pub use ticker::{Ticker, spawn_ticker};

use metrics::SharedString;

use crate::ConfigError;
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// The label every metric of the workspace carries: the name of the layer that wrote it.
pub const NAME_LABEL: &str = "name";

/// What a layer calls itself in its metrics (label `name`) and its logs (field `name`).
///
/// Non-empty printable ASCII (`0x20` to `0x7e`), at most [`LayerName::MAX_LEN`] bytes, so
/// that it fits a Prometheus label, a log field and a structured header field (a rate
/// limit's name is also its `RateLimit-Policy` name). Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LayerName(SharedString);

impl LayerName {
    /// The name of a layer nobody named: `"default"`.
    pub const DEFAULT: &'static str = "default";

    /// The longest name accepted, in bytes: 128.
    pub const MAX_LEN: usize = 128;

    /// A checked name.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the setting `name` when `name` is empty, longer than
    /// [`MAX_LEN`](Self::MAX_LEN) bytes, or holds anything but printable ASCII.
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        if name.is_empty()
            || name.len() > Self::MAX_LEN
            || !name.bytes().all(|b| (0x20..=0x7e).contains(&b))
        {
            return Err(ConfigError::invalid(
                "name",
                &name,
                "1 to 128 bytes of printable ASCII (0x20 to 0x7e)",
            ));
        }
        Ok(Self(SharedString::from_owned(name)))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a metric label value (a cheap clone).
    pub fn label(&self) -> SharedString {
        self.0.clone()
    }
}

impl Default for LayerName {
    fn default() -> Self {
        Self(SharedString::const_str(Self::DEFAULT))
    }
}

impl fmt::Debug for LayerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for LayerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A layer's metric handles, registered together.
pub trait MetricSet: Send + Sync + 'static {
    /// Registers every handle of the set with the current recorder (the thread's local one
    /// if set, else the global one), each labelled [`NAME_LABEL`] `=` `name`.
    fn register(name: &LayerName) -> Self;
}

/// A layer's metric handles, registered on first use and then kept: the one registration
/// pattern of the workspace.
///
/// Shared by the clones of a layer (keep it behind the layer's `Arc`), so the handles are
/// registered once per layer, on its first request, with whatever recorder is installed
/// then.
pub struct LazyMetrics<M> {
    name: LayerName,
    handles: OnceLock<M>,
}

impl<M: MetricSet> LazyMetrics<M> {
    /// Handles for the layer `name`, not registered yet.
    pub const fn new(name: LayerName) -> Self {
        Self {
            name,
            handles: OnceLock::new(),
        }
    }

    /// The handles, registered on the first call.
    #[inline]
    pub fn get(&self) -> &M {
        self.handles.get_or_init(|| M::register(&self.name))
    }

    /// The handles if the first call has happened.
    pub fn registered(&self) -> Option<&M> {
        self.handles.get()
    }

    /// The layer's name.
    pub const fn name(&self) -> &LayerName {
        &self.name
    }
}

impl<M> fmt::Debug for LazyMetrics<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyMetrics")
            .field("name", &self.name)
            .field("registered", &self.handles.get().is_some())
            .finish()
    }
}

/// A condition a layer enters and leaves: a limit rejecting, the stop signal engaged, a
/// backend away, a budget refusing.
///
/// The layer reports every occurrence with [`seen`](Self::seen), which says when the
/// condition has just begun, and asks [`quiet_for`](Self::quiet_for) (on a request that
/// did not meet the condition, or on a [tick](spawn_ticker)) whether it has ended: it ends
/// once it has not been seen for the given time. The layer logs each change once, so an
/// operator sees one `WARN` when a storm starts and one `INFO` when it is over, whatever
/// the request rate. Lock-free; an occurrence while active costs one relaxed load and, at
/// most once per millisecond, one store.
#[derive(Debug, Default)]
pub struct Episode {
    active: AtomicBool,
    /// When the current episode began, in the clock's nanoseconds.
    began: AtomicU64,
    /// When the condition was last seen, to the millisecond.
    last_seen: AtomicU64,
}

/// How an episode that has just ended went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// From its first occurrence to its last.
    pub lasted: Duration,
}

const MILLI: u64 = 1_000_000;

impl Episode {
    /// An episode not under way.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an occurrence at `now` (nanoseconds of the layer's clock); `true` when it
    /// begins an episode, which the caller then logs.
    #[inline]
    pub fn seen(&self, now: u64) -> bool {
        if self.last_seen.load(Ordering::Relaxed).saturating_add(MILLI) <= now {
            self.last_seen.store(now, Ordering::Relaxed);
        }
        if self.active.load(Ordering::Relaxed) {
            return false;
        }
        self.begin(now)
    }

    #[cold]
    fn begin(&self, now: u64) -> bool {
        if self
            .active
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.began.store(now, Ordering::Relaxed);
        self.last_seen.store(now, Ordering::Relaxed);
        true
    }

    /// Ends the episode when its condition has not been seen for `quiet` at `now`; the
    /// ended episode, which the caller then logs, or `None` (not under way, or not quiet
    /// long enough, or another thread ended it).
    #[inline]
    pub fn quiet_for(&self, quiet: Duration, now: u64) -> Option<Ended> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let last = self.last_seen.load(Ordering::Relaxed);
        if now.saturating_sub(last) < crate::clock::saturating_nanos(quiet) {
            return None;
        }
        self.end(last)
    }

    /// Ends the episode now, whatever happened last (a backend that answers again).
    pub fn end_now(&self, now: u64) -> Option<Ended> {
        self.last_seen.store(now, Ordering::Relaxed);
        self.end(now)
    }

    #[cold]
    fn end(&self, last: u64) -> Option<Ended> {
        self.active
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        let began = self.began.load(Ordering::Relaxed);
        Some(Ended {
            lasted: Duration::from_nanos(last.saturating_sub(began)),
        })
    }

    /// Whether an episode is under way.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }
}

/// A condition that is logged every time it recurs, but at most once per interval: a
/// misconfiguration a request shows (a request without a caller key, without a rate-limit
/// key), which must not be reported once and then forgotten, nor once per request.
///
/// The layer counts every occurrence in a metric and calls [`note`](Self::note), which says
/// when a log line is due and how many occurrences it covers. Lock-free: an occurrence costs
/// one atomic addition and one relaxed load; one thread per interval wins the line.
///
/// ```
/// use std::time::Duration;
/// use overload_core::telemetry::LogThrottle;
///
/// let throttle = LogThrottle::new(Duration::from_secs(60));
/// let s = |secs: u64| secs * 1_000_000_000;
/// assert_eq!(throttle.note(s(0)), Some(1), "the first is logged at once");
/// assert_eq!(throttle.note(s(10)), None);
/// assert_eq!(throttle.note(s(59)), None);
/// assert_eq!(throttle.note(s(60)), Some(3), "a minute later, with the two in between");
/// ```
#[derive(Debug)]
pub struct LogThrottle {
    interval: u64,
    /// When the next line is due (clock nanoseconds); 0: at the first occurrence.
    next: AtomicU64,
    /// Occurrences since the last line.
    unreported: AtomicU64,
}

impl LogThrottle {
    /// A throttle that lets a line through at the first occurrence, then at most once per
    /// `interval` (at least a nanosecond).
    pub fn new(interval: Duration) -> Self {
        Self {
            interval: crate::clock::saturating_nanos(interval).max(1),
            next: AtomicU64::new(0),
            unreported: AtomicU64::new(0),
        }
    }

    /// Records an occurrence at `now` (nanoseconds of the layer's clock). `Some(n)` when a
    /// line is due: the caller logs it, saying that `n` occurrences (this one included)
    /// happened since the last line; `None` otherwise.
    #[inline]
    pub fn note(&self, now: u64) -> Option<u64> {
        self.unreported.fetch_add(1, Ordering::Relaxed);
        let next = self.next.load(Ordering::Relaxed);
        if now < next {
            return None;
        }
        self.claim(next, now)
    }

    #[cold]
    fn claim(&self, next: u64, now: u64) -> Option<u64> {
        self.next
            .compare_exchange(
                next,
                now.saturating_add(self.interval),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()?;
        Some(self.unreported.swap(0, Ordering::AcqRel))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    #[test]
    fn names_are_checked_and_default_to_default() {
        assert_eq!(LayerName::default().as_str(), "default");
        assert_eq!(
            LayerName::new("payments-api").unwrap().as_str(),
            "payments-api"
        );
        for bad in ["", "caf\u{e9}", "tab\there", &"x".repeat(129)] {
            let err = LayerName::new(bad).unwrap_err();
            assert_eq!(err.field(), "name", "{bad:?}");
        }
        assert!(LayerName::new("x".repeat(128)).is_ok());
    }

    struct Handles {
        requests: metrics::Counter,
    }

    impl MetricSet for Handles {
        fn register(name: &LayerName) -> Self {
            Self {
                requests: metrics::counter!("test_requests_total", NAME_LABEL => name.label()),
            }
        }
    }

    #[test]
    fn handles_register_on_first_use_with_the_recorder_installed_then() {
        let metrics = LazyMetrics::<Handles>::new(LayerName::new("late").unwrap());
        assert!(metrics.registered().is_none());
        // The recorder comes after the layer was built, before its first request.
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            metrics.get().requests.increment(2);
            metrics.get().requests.increment(1);
        });
        let snapshot = snapshotter.snapshot().into_vec();
        assert_eq!(snapshot.len(), 1);
        let (key, _, _, value) = &snapshot[0];
        let labels: Vec<_> = key.key().labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(labels, [("name", "late")]);
        assert_eq!(value, &DebugValue::Counter(3));
    }

    #[test]
    fn an_episode_begins_once_and_ends_after_a_quiet_period() {
        let episode = Episode::new();
        let s = |secs: u64| secs * 1_000_000_000;
        assert!(episode.seen(s(1)));
        assert!(!episode.seen(s(2)), "already under way");
        assert!(!episode.seen(s(3)));
        // Seen at 3 s: not quiet for 5 s until 8 s.
        assert_eq!(episode.quiet_for(Duration::from_secs(5), s(7)), None);
        let ended = episode.quiet_for(Duration::from_secs(5), s(8)).unwrap();
        assert_eq!(ended.lasted, Duration::from_secs(2));
        assert!(!episode.is_active());
        assert_eq!(
            episode.quiet_for(Duration::from_secs(5), s(20)),
            None,
            "ended once"
        );
        assert!(episode.seen(s(30)), "a new episode");
        assert_eq!(
            episode.end_now(s(31)),
            Some(Ended {
                lasted: Duration::from_secs(1)
            })
        );
    }

    #[test]
    fn a_throttled_log_recurs_once_per_interval_and_counts_what_it_skipped() {
        let throttle = LogThrottle::new(Duration::from_secs(60));
        let s = |secs: u64| secs * 1_000_000_000;
        assert_eq!(throttle.note(s(5)), Some(1));
        for t in 6..65 {
            assert_eq!(throttle.note(s(t)), None, "at {t} s");
        }
        assert_eq!(throttle.note(s(65)), Some(60));
        assert_eq!(throttle.note(s(66)), None);
        // A clock that starts at zero logs the first occurrence too.
        assert_eq!(LogThrottle::new(Duration::ZERO).note(0), Some(1));
    }
}

/// Model tests of [`LogThrottle`] under loom:
/// `RUSTFLAGS="--cfg loom" cargo test -p overload-core --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// Two occurrences at once when a line is due: exactly one thread logs, and the lines
    /// (with what is left unreported) account for both occurrences.
    #[test]
    fn loom_throttle_one_line_per_interval_and_nothing_lost() {
        loom::model(|| {
            let throttle = Arc::new(LogThrottle::new(Duration::from_secs(60)));
            let other = Arc::clone(&throttle);
            let t = thread::spawn(move || other.note(1));
            let here = throttle.note(1);
            let there = t.join().unwrap();
            let lines = [here, there];
            assert_eq!(lines.iter().filter(|l| l.is_some()).count(), 1, "{lines:?}");
            let reported: u64 = lines.iter().flatten().sum();
            let left = throttle.unreported.load(Ordering::Relaxed);
            assert_eq!(reported + left, 2);
            // The next line, past the interval, reports what the first one left.
            let later = throttle.note(61_000_000_000).unwrap();
            assert_eq!(reported + later, 3);
        });
    }
}
