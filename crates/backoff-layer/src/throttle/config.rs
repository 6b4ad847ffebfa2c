//! [`Throttle`] and its builder: the settings, their defaults and their rules.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::LayerName;
use overload_signal::protocol::Criticality;

use crate::backoff::Seeds;
use crate::throttle::refused::Throttled;
use crate::throttle::rule::ThrottleRule;
use crate::throttle::scope::{Target, ThrottleScope};
use crate::throttle::shared::{ThrottleSettings, ThrottleShared};
use crate::throttle::table::{ThrottleOutcome, ThrottleTicket};

/// A client-side adaptive throttle: per destination, it refuses locally a share of the
/// requests to a destination that keeps failing, and sends the rest as probes. See the
/// [module docs](crate::throttle) for the rule, its anchors and its defaults.
///
/// Cheap to clone: clones share the state, so a throttle given to several layers (or to the
/// clones of one client stack) sees the whole load of each destination. Made by
/// [`Throttle::new`] or [`Throttle::builder`]; a retry layer makes its own unless given one
/// ([`RetryBuilder::throttle`](crate::RetryBuilder::throttle)) or told not to
/// ([`RetryBuilder::no_throttle`](crate::RetryBuilder::no_throttle)).
#[derive(Clone)]
pub struct Throttle {
    shared: Arc<ThrottleShared>,
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.shared, f)
    }
}

impl Throttle {
    /// The default window: 2 seconds. Long enough to judge on hundreds of outcomes at
    /// a hundred requests per second, short enough to forget a window full of successes in
    /// about a second once failures outnumber them (the SRE book counts over 2 minutes,
    /// gRPC-Go and Envoy over 30 s: none reacts within a 20 s outage that follows a full
    /// window of successes).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(2);
    /// The default number of slots the window slides by: 10, so the probability is decided
    /// again every 200 ms (gRPC-Go's throttler uses 100 bins over its 30 s).
    pub const DEFAULT_SLOTS: u32 = 10;
    /// The default K: 2, the SRE book's. Nothing is refused while a destination accepts at
    /// least half of what it is sent.
    pub const DEFAULT_MULTIPLIER: f64 = 2.0;
    /// The default highest refusal probability: 0.9, so at least one request in ten always
    /// goes, as a probe (Envoy's admission control caps rejection at 0.8; the SRE book and
    /// gRPC-Go have no cap, so their probes thin out as the probability nears 1).
    pub const DEFAULT_MAX_PROBABILITY: f64 = 0.9;
    /// The default number of failures a window must hold before a destination starts being
    /// throttled: 10, so that chance cannot start it on a few requests (at 20 % failures, 10
    /// failures outnumbering the accepts of one window has a probability under 1e-4).
    pub const DEFAULT_MIN_FAILURES: u32 = 10;
    /// The default number of destinations tracked: 256 (in buckets of 8); a destination
    /// that finds its bucket full is sent without throttling.
    pub const DEFAULT_MAX_DESTINATIONS: usize = 256;
    /// The default number of destinations with a gauge series of their own: 32, the first
    /// 32 destinations throttled; every later one shares the series `(other)`. See
    /// [`ThrottleBuilder::max_labelled_destinations`].
    pub const DEFAULT_MAX_LABELLED_DESTINATIONS: usize = 32;
    /// The most destinations with a series of their own accepted: 1 024.
    pub const MAX_LABELLED_DESTINATIONS: usize = 1_024;
    /// The most destinations accepted: 65 536.
    pub const MAX_DESTINATIONS: usize = 65_536;
    /// The most slots accepted: 64.
    pub const MAX_SLOTS: u32 = 64;
    /// The shortest slot accepted (window divided by slots): 10 milliseconds, the ticker's
    /// period.
    pub const MIN_SLOT: Duration = Duration::from_millis(10);
    /// The longest window accepted: 10 minutes.
    pub const MAX_WINDOW: Duration = Duration::from_secs(600);
    /// The largest K accepted: 100.
    pub const MAX_MULTIPLIER: f64 = 100.0;

    /// A throttle with every default (see the [module docs](crate::throttle#defaults)),
    /// named `"default"`.
    pub fn new() -> Self {
        Self::builder().finish(LayerName::default())
    }

    /// A builder starting from the defaults.
    pub fn builder() -> ThrottleBuilder {
        ThrottleBuilder {
            name: None,
            window: Self::DEFAULT_WINDOW,
            slots: Self::DEFAULT_SLOTS,
            multiplier: Self::DEFAULT_MULTIPLIER,
            max_probability: Self::DEFAULT_MAX_PROBABILITY,
            min_failures: Self::DEFAULT_MIN_FAILURES,
            max_destinations: Self::DEFAULT_MAX_DESTINATIONS,
            max_labelled_destinations: Self::DEFAULT_MAX_LABELLED_DESTINATIONS,
            scope: ThrottleScope::Destination,
            clock: None,
            seeds: None,
        }
    }

    /// The default throttle of a retry layer named `name`, drawing from `seeds` (derived
    /// from the layer's, so a seeded layer's throttle is seeded too).
    pub(crate) fn named(name: LayerName, seeds: Seeds) -> Self {
        Self::builder().seeds(seeds).finish(name)
    }

    /// The throttle's name: the label `name` of its metrics and the field `name` of its
    /// logs.
    pub fn name(&self) -> &str {
        self.shared.name().as_str()
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.shared.settings().window
    }

    /// The number of slots the window slides by.
    pub fn slots(&self) -> u32 {
        self.shared.settings().slots
    }

    /// K.
    pub fn multiplier(&self) -> f64 {
        self.shared.settings().rule.multiplier
    }

    /// The highest refusal probability.
    pub fn max_probability(&self) -> f64 {
        self.shared.settings().rule.max_probability
    }

    /// Failures a window must hold before a destination starts being throttled.
    pub fn min_failures(&self) -> u32 {
        u32::try_from(self.shared.settings().rule.min_failures).unwrap_or(u32::MAX)
    }

    /// The number of destinations tracked.
    pub fn max_destinations(&self) -> usize {
        self.shared.settings().max_destinations
    }

    /// The number of destinations with a gauge series of their own.
    pub fn max_labelled_destinations(&self) -> usize {
        self.shared.settings().max_labelled_destinations
    }

    /// Which requests share a state.
    pub fn scope(&self) -> ThrottleScope {
        self.shared.settings().scope
    }

    /// The current refusal probability of the destination of `uri` (within 0..=1; 0 for a
    /// destination not tracked).
    ///
    /// ```
    /// use backoff_layer::throttle::Throttle;
    ///
    /// let throttle = Throttle::new();
    /// assert_eq!(throttle.probability(&"http://10.0.0.7:8080/".parse()?), 0.0);
    /// # Ok::<(), http::uri::InvalidUri>(())
    /// ```
    pub fn probability(&self, uri: &Uri) -> f64 {
        self.shared.probability(Target::uri(uri))
    }

    /// Decides whether a request of `level` to `target` is sent (see `ThrottleShared::admit`).
    #[inline]
    pub(crate) fn admit_at(
        &self,
        target: Target<'_>,
        level: Criticality,
    ) -> Result<Option<ThrottleTicket>, Throttled> {
        self.shared.admit(target, level)
    }

    /// [`admit_at`](Self::admit_at) for a request of the default level (`critical`).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn admit(&self, target: Target<'_>) -> Result<Option<ThrottleTicket>, Throttled> {
        self.admit_at(target, Criticality::default())
    }

    #[inline]
    pub(crate) fn record(&self, ticket: ThrottleTicket, outcome: Option<ThrottleOutcome>) {
        self.shared.record(ticket, outcome);
    }

    /// One tick now, as the ticker does every slot of time: for the tests, which move a fake
    /// clock.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn tick(&self) -> crate::throttle::tick::TickReport {
        self.shared.tick()
    }
}

impl Default for Throttle {
    /// The same as [`Throttle::new`].
    fn default() -> Self {
        Self::new()
    }
}

/// Configures a [`Throttle`]; made by [`Throttle::builder`]. Every setting has a default:
///
/// | setting | default | source |
/// |---|---|---|
/// | [`name`](Self::name) | `"default"`, or the retry layer's name for the throttle a layer makes | |
/// | [`window`](Self::window) | 2 s | this crate: reacts within a 20 s outage (the SRE book's 2 min, gRPC-Go's and Envoy's 30 s do not) |
/// | [`slots`](Self::slots) | 10 (a decision every 200 ms) | gRPC-Go's bins, fewer |
/// | [`multiplier`](Self::multiplier) | K = 2 | the SRE book |
/// | [`max_probability`](Self::max_probability) | 0.9: one request in ten always probes | Envoy's cap (0.8), a little higher |
/// | [`min_failures`](Self::min_failures) | 10 per window | Envoy's `rps_threshold`, as a count of failures |
/// | [`max_destinations`](Self::max_destinations) | 256, beyond them not throttled | |
/// | [`max_labelled_destinations`](Self::max_labelled_destinations) | 32 with a gauge series of their own, the rest sharing `(other)` | |
/// | [`scope`](Self::scope) | [`ThrottleScope::Destination`]: scheme, host and port | the SRE book's per-backend throttle |
/// | [`clock`](Self::clock) | [`TokioClock`] | |
/// | [`seeds`](Self::seeds) | [`Seeds::from_os()`] | |
///
/// [`build`](Self::build) checks the settings:
///
/// - `name` is non-empty printable ASCII, at most 128 bytes;
/// - `window` is at most 10 minutes, `slots` within 1..=64, and `window / slots` at least
///   10 ms;
/// - `multiplier` is finite and within 1..=100 (under 1 would throttle a destination that
///   never fails);
/// - `max_probability` is finite and within 0..1, both excluded (1 would stop the probes
///   that see a destination come back; 0 throttles nothing: use
///   [`RetryBuilder::no_throttle`](crate::RetryBuilder::no_throttle));
/// - `max_destinations` is within 1..=65 536;
/// - `max_labelled_destinations` is within 0..=1 024.
#[must_use = "a builder does nothing until `build` is called"]
pub struct ThrottleBuilder {
    name: Option<String>,
    window: Duration,
    slots: u32,
    multiplier: f64,
    max_probability: f64,
    min_failures: u32,
    max_destinations: usize,
    max_labelled_destinations: usize,
    scope: ThrottleScope,
    clock: Option<Box<dyn Clock>>,
    seeds: Option<Seeds>,
}

impl fmt::Debug for ThrottleBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleBuilder")
            .field("name", &self.name)
            .field("window", &self.window)
            .field("slots", &self.slots)
            .field("multiplier", &self.multiplier)
            .field("max_probability", &self.max_probability)
            .field("min_failures", &self.min_failures)
            .field("max_destinations", &self.max_destinations)
            .field("max_labelled_destinations", &self.max_labelled_destinations)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl ThrottleBuilder {
    /// What the throttle calls itself: the label `name` of its metrics and the field `name`
    /// of its logs. A retry layer's own throttle takes the layer's name; name one you share
    /// between layers after what it protects. Default: `"default"`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The window the outcomes are counted over. At most 10 minutes. Default: 2 s
    /// ([`Throttle::DEFAULT_WINDOW`] says why).
    pub const fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How many slots the window slides by: the probability is decided again every
    /// `window / slots`, at least 10 ms. Within 1..=64. Default: 10.
    pub const fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    /// K: nothing is refused while a destination accepts at least `1 / K` of the attempts it
    /// is sent; below, the refusal probability is `(sent - K * accepts) / (sent + 1)`.
    /// Within 1..=100. Default: 2, the SRE book's.
    pub const fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The highest refusal probability: `1 - max_probability` of the requests to a failing
    /// destination always go, as probes. Within 0..1, both excluded. Default: 0.9.
    pub const fn max_probability(mut self, max_probability: f64) -> Self {
        self.max_probability = max_probability;
        self
    }

    /// How many failures a window must hold before a destination that is not throttled
    /// starts being throttled (a throttled one needs none to stay so). A destination sent
    /// fewer than `min_failures / window` requests per second is never throttled. Default:
    /// 10.
    pub const fn min_failures(mut self, min_failures: u32) -> Self {
        self.min_failures = min_failures;
        self
    }

    /// How many destinations the throttle tracks, rounded up to whole buckets of 8 and to a
    /// power of two of buckets. A destination whose bucket holds 8 others is sent without
    /// throttling (counted in `backoff_layer_throttle_untracked_total`, logged once); a
    /// destination without a request for 10 windows gives its place up. Within 1..=65 536.
    /// Default: 256.
    pub const fn max_destinations(mut self, max_destinations: usize) -> Self {
        self.max_destinations = max_destinations;
        self
    }

    /// How many destinations get a series of their own in the gauge
    /// `backoff_layer_throttle_probability`: the first `max_labelled_destinations`
    /// destinations throttled keep theirs for the life of the throttle (a destination that
    /// is throttled again later is set in its own series again); every other destination
    /// throttled shares the series whose `destination` label is `(other)`, which shows the
    /// highest refusal probability among them (0 when none is throttled).
    ///
    /// A recorder keeps every series it was given (the `metrics` facade cannot delete one),
    /// and destinations may come from your users (webhooks, a forward proxy): this bound
    /// keeps the throttle's series at `max_labelled_destinations + 3` (the gauges, `(other)`
    /// and the two counters) whatever destinations the client reaches. `0` puts every
    /// destination under `(other)`. Logs still name each destination (once when its
    /// throttling begins, once when it ends). Within 0..=1 024. Default: 32.
    ///
    /// ```
    /// use backoff_layer::throttle::Throttle;
    ///
    /// // A client of webhooks: no series per destination at all.
    /// let throttle = Throttle::builder().name("webhooks").max_labelled_destinations(0).build()?;
    /// assert_eq!(throttle.max_labelled_destinations(), 0);
    /// # Ok::<(), backoff_layer::ConfigError>(())
    /// ```
    pub const fn max_labelled_destinations(mut self, max_labelled_destinations: usize) -> Self {
        self.max_labelled_destinations = max_labelled_destinations;
        self
    }

    /// Which requests share a state. Default: [`ThrottleScope::Destination`].
    pub const fn scope(mut self, scope: ThrottleScope) -> Self {
        self.scope = scope;
        self
    }

    /// The clock the window's slots follow. Default: [`TokioClock`], which follows tokio's
    /// paused time in tests. The ticker still runs on tokio's timers, at every slot.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Box::new(clock));
        self
    }

    /// Where the random draws that decide which requests to a throttled destination are
    /// refused come from. Default: [`Seeds::from_os()`]; tests and simulations pass
    /// [`Seeds::from_seed`] to make refusals reproducible. (The throttle a retry layer makes
    /// draws from a source derived from the layer's [`seeds`](crate::RetryBuilder::seeds).)
    pub fn seeds(mut self, seeds: Seeds) -> Self {
        self.seeds = Some(seeds);
        self
    }

    /// Checks the settings and builds the throttle.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that breaks one of the rules listed on
    /// [`ThrottleBuilder`].
    pub fn build(mut self) -> Result<Throttle, ConfigError> {
        let name = match self.name.take() {
            Some(name) => LayerName::new(name)?,
            None => LayerName::default(),
        };
        self.check()?;
        Ok(self.finish(name))
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.window > Throttle::MAX_WINDOW {
            return Err(ConfigError::out_of_range(
                "window",
                self.window,
                "at most 10 minutes",
            ));
        }
        if !(1..=Throttle::MAX_SLOTS).contains(&self.slots) {
            return Err(ConfigError::out_of_range(
                "slots",
                self.slots,
                "within 1..=64",
            ));
        }
        if self.window / self.slots < Throttle::MIN_SLOT {
            return Err(ConfigError::conflict(
                "window",
                format_args!(
                    "window / slots must be at least 10ms, got {:?} / {} = {:?}",
                    self.window,
                    self.slots,
                    self.window / self.slots
                ),
            ));
        }
        if !self.multiplier.is_finite() {
            return Err(ConfigError::not_finite("multiplier", self.multiplier));
        }
        if !(1.0..=Throttle::MAX_MULTIPLIER).contains(&self.multiplier) {
            return Err(ConfigError::out_of_range(
                "multiplier",
                self.multiplier,
                "within 1..=100",
            ));
        }
        if !self.max_probability.is_finite() {
            return Err(ConfigError::not_finite(
                "max_probability",
                self.max_probability,
            ));
        }
        if self.max_probability <= 0.0 || self.max_probability >= 1.0 {
            return Err(ConfigError::out_of_range(
                "max_probability",
                self.max_probability,
                "within 0..1, both excluded",
            ));
        }
        if !(1..=Throttle::MAX_DESTINATIONS).contains(&self.max_destinations) {
            return Err(ConfigError::out_of_range(
                "max_destinations",
                self.max_destinations,
                "within 1..=65536",
            ));
        }
        if self.max_labelled_destinations > Throttle::MAX_LABELLED_DESTINATIONS {
            return Err(ConfigError::out_of_range(
                "max_labelled_destinations",
                self.max_labelled_destinations,
                "within 0..=1024",
            ));
        }
        Ok(())
    }

    /// The throttle named `name`, without checks: for [`build`](Self::build) and the
    /// defaults.
    fn finish(self, name: LayerName) -> Throttle {
        let settings = ThrottleSettings {
            rule: ThrottleRule {
                multiplier: self.multiplier,
                max_probability: self.max_probability,
                min_failures: u64::from(self.min_failures),
            },
            window: self.window,
            slots: self.slots,
            max_destinations: self.max_destinations,
            max_labelled_destinations: self.max_labelled_destinations,
            scope: self.scope,
        };
        let clock = self.clock.unwrap_or_else(|| Box::new(TokioClock::new()));
        let seeds = self.seeds.unwrap_or_else(Seeds::from_os);
        Throttle {
            shared: Arc::new(ThrottleShared::new(settings, name, clock, seeds)),
        }
    }
}
