use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::WallClock;
use overload_core::telemetry::LayerName;
use tower_layer::Layer;

use super::service::Deadline;
use super::state::{self, DeadlineSettings, DeadlineState};
use crate::signal::trust::Trust;

/// Applies [`Deadline`] to a service: answers a request whose caller's deadline has passed
/// at once, without running the inner service, cancels one still running at its deadline,
/// and lets the inner service read the time left. See the [module docs](crate::deadline).
///
/// Cheap to clone: the services it makes share its settings, metrics and logs.
///
/// Defaults ([`DeadlineLayer::new`], [`DeadlineLayer::builder`]):
///
/// - a skew allowance of 250 ms ([`DEFAULT_SKEW_ALLOWANCE`](Self::DEFAULT_SKEW_ALLOWANCE)
///   says why);
/// - work still running at its deadline is cancelled
///   ([`cancel_at_deadline`](DeadlineLayerBuilder::cancel_at_deadline));
/// - the send times of callers on private networks believed, and no one else's
///   ([`Trust::private_networks`]: an Internet client's deadline counts from arrival);
/// - the time of day read from the operating system ([`SystemWallClock`]);
/// - named `"default"` ([`LayerName::DEFAULT`]) in its metrics and logs.
///
/// [`SystemWallClock`]: overload_core::clock::SystemWallClock
#[derive(Clone)]
pub struct DeadlineLayer {
    state: Arc<DeadlineState>,
    /// Whose send times count; `None`: the default, not set (kept apart from `state` so that
    /// `with_trust` can set it on a built layer, and a second setting is refused).
    trust: Option<Trust>,
}

impl DeadlineLayer {
    /// How far apart two hosts' clocks may be before the layer stops trusting a send time:
    /// 250 ms.
    ///
    /// `X-Request-Deadline` carries an absolute send time, which a server compares with its
    /// own clock. Hosts kept by NTP stay within ntpd's 128 ms step threshold of their source
    /// (beyond it ntpd steps the clock), so two of them are within about 256 ms of each other;
    /// chrony or a cloud provider's time service keeps hosts of one data centre within a
    /// millisecond or so. 250 ms covers every host whose time synchronisation works, and
    /// keeps the time an expired request may still be served short (a quarter of a second
    /// past its caller's deadline, at worst, against the seconds callers usually wait). What
    /// it does:
    ///
    /// - a request is dropped on arrival only once its deadline, as the send time and this
    ///   server's clock place it, has passed **by more than the allowance**, and work still
    ///   running is cancelled at the deadline plus the allowance: a server whose clock is up
    ///   to the allowance ahead of its callers' never drops work they still wait for;
    /// - a send time further than the allowance **in the future** means the sender's clock is
    ///   ahead of this one's by more than that: the layer then counts the deadline from
    ///   arrival (the `timeout` alone, as gRPC does), counts the request as skewed
    ///   (`overload_signal_deadline_skewed_total`) and logs the skew once;
    /// - a server whose clock is **ahead** by more than the allowance cannot tell the skew
    ///   from queueing: every request looks that much older, so those with less time left
    ///   than the excess are dropped on arrival with `504`, and the
    ///   `overload_signal_deadline_expired_queued_seconds` histogram shows the skew as a
    ///   floor under every expired request's queue time.
    ///
    /// The deadline a handler reads, and passes on to its downstream calls, is the caller's,
    /// without the allowance: a tier never gives its downstream more time than its caller
    /// has left. Except for a request admitted only thanks to the allowance (its deadline
    /// passed, on this clock, by less than it): that one runs with the time until its work
    /// would be cancelled, never more than its caller's timeout, rather than with none (see
    /// [the time left a request runs with](crate::deadline#the-time-left-a-request-runs-with)).
    /// A relative timeout (gRPC's `grpc-timeout`, Envoy's `x-envoy-expected-rq-timeout-ms`),
    /// which has no send time, needs no allowance.
    pub const DEFAULT_SKEW_ALLOWANCE: Duration = state::DEFAULT_SKEW_ALLOWANCE;

    /// The largest skew allowance [`build`](DeadlineLayerBuilder::build) accepts: one
    /// minute. Hosts whose clocks disagree by more have no working time synchronisation,
    /// and an allowance that long would serve work whose callers left a minute ago.
    pub const MAX_SKEW_ALLOWANCE: Duration = Duration::from_secs(60);

    /// The longest a trusted caller's request is believed to have queued: one hour. A send
    /// time further in the past is a clock that is wrong (or a field that lies), not a
    /// queue: no listen queue, proxy or client holds a request that long. Such a deadline
    /// is counted from arrival and counted as skewed, as one from the future is, rather
    /// than put a sample of years in `overload_signal_deadline_expired_queued_seconds`.
    pub const MAX_QUEUED: Duration = state::MAX_QUEUED;

    /// Whether work still running at its deadline is cancelled, by default: yes. Nobody
    /// waits for its answer; the threads, connections and locks it holds are better spent
    /// on requests someone still waits for.
    pub const DEFAULT_CANCEL_AT_DEADLINE: bool = true;

    /// How long the layer must go without an expired request (or one sent from the future)
    /// before it logs that the episode ended: 10 seconds, the overload layer's window. Not a
    /// setting.
    pub const QUIET: Duration = state::QUIET;

    /// A layer with every default; see [`DeadlineLayer`].
    pub fn new() -> Self {
        Self {
            state: Arc::new(DeadlineState::new(DeadlineSettings::new())),
            trust: None,
        }
    }

    /// A builder that starts from the defaults.
    pub fn builder() -> DeadlineLayerBuilder {
        DeadlineLayerBuilder {
            name: None,
            settings: DeadlineSettings::new(),
            trust: None,
        }
    }

    /// Whose send times the layer believes: what [`DeadlineLayerBuilder::trust`] set, or
    /// `None` for the default ([`Trust::private_networks`]).
    pub fn trust(&self) -> Option<&Trust> {
        self.trust.as_ref()
    }

    /// This layer, its metrics and logs shared with the original, believing the send times
    /// of `trust`'s callers instead: what [`DeadlineLayerBuilder::trust`] sets, for a layer
    /// already built (`ratelimit-layer`'s `OverloadProtectionLayerBuilder::trust` uses it).
    #[must_use]
    pub fn with_trust(mut self, trust: Trust) -> Self {
        self.trust = Some(trust);
        self
    }

    /// The layer's name: the `name` label of its metrics and the `name` field of its logs.
    pub fn name(&self) -> &LayerName {
        self.state.name()
    }

    /// The skew allowance.
    pub fn skew_allowance(&self) -> Duration {
        self.state.skew_allowance
    }

    /// Whether work still running at its deadline is cancelled.
    pub fn cancel_at_deadline(&self) -> bool {
        self.state.cancel_at_deadline
    }
}

impl Default for DeadlineLayer {
    /// The same as [`DeadlineLayer::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DeadlineLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineLayer")
            .field("state", &self.state)
            .field("trust", &self.trust)
            .finish()
    }
}

impl DeadlineLayer {
    /// What each service this layer makes holds: the shared state, and the trust (the
    /// default when none was set).
    pub(crate) fn service_parts(&self) -> (Arc<DeadlineState>, Trust) {
        (
            Arc::clone(&self.state),
            self.trust.clone().unwrap_or_default(),
        )
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        let (state, trust) = self.service_parts();
        Deadline::from_state(inner, state, trust)
    }
}

/// Builds a [`DeadlineLayer`]; made by [`DeadlineLayer::builder`]. Every setting starts at
/// its default; [`build`](Self::build) checks them:
///
/// - `name` is 1 to 128 bytes of printable ASCII;
/// - `skew_allowance` is at most [`DeadlineLayer::MAX_SKEW_ALLOWANCE`] (one minute).
#[must_use = "a builder does nothing until `build` is called"]
pub struct DeadlineLayerBuilder {
    /// The name as set, checked by `build`; `None`: the default.
    name: Option<String>,
    settings: DeadlineSettings,
    trust: Option<Trust>,
}

impl DeadlineLayerBuilder {
    /// What the layer calls itself: the label `name` of every metric it writes and the field
    /// `name` of every state change it logs. Default: `"default"` ([`LayerName::DEFAULT`]).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How far apart this server's clock and its callers' may be; see
    /// [`DeadlineLayer::DEFAULT_SKEW_ALLOWANCE`] for what it changes. Zero for callers on the
    /// same host (one clock), or where the hosts' clocks are known to agree. At most one
    /// minute. Default: 250 ms.
    pub const fn skew_allowance(mut self, skew_allowance: Duration) -> Self {
        self.settings.skew_allowance = skew_allowance;
        self
    }

    /// Whether work still running at its deadline (plus the skew allowance, for a deadline
    /// with a send time) is cancelled: its future dropped, and the request answered `504`
    /// (gRPC `DEADLINE_EXCEEDED`). `false` lets every request the layer admitted run to its
    /// end (for handlers that must not stop half-way); requests expired on arrival are still
    /// answered at once. Default: `true`
    /// ([`DeadlineLayer::DEFAULT_CANCEL_AT_DEADLINE`]).
    ///
    /// The cancellation bounds the time to the response's head: once the inner service has
    /// returned a response, its body streams for as long as it lasts.
    pub const fn cancel_at_deadline(mut self, cancel: bool) -> Self {
        self.settings.cancel_at_deadline = cancel;
        self
    }

    /// Whose send times the layer believes. A send time lets the layer see how long a
    /// request queued, and shows clock skew; it is also the caller's word, so the layer
    /// reads it only from callers `trust` trusts. Anyone else's `X-Request-Deadline` counts
    /// from arrival (its `timeout` alone, as gRPC's `grpc-timeout` and Envoy's
    /// `x-envoy-expected-rq-timeout-ms` do, from anyone), which can only
    /// shorten that caller's own request, is never counted as skewed, and puts no sample in
    /// the queued-time histogram. Default: [`Trust::private_networks`] (see
    /// [`trust`](crate::signal::trust)).
    ///
    /// The same setting decides whose attempt counters the overload layer counts;
    /// `ratelimit-layer`'s `OverloadProtectionLayerBuilder::trust` sets both at once.
    ///
    /// ```
    /// use overload_signal::{DeadlineLayer, Trust};
    ///
    /// // Every caller's send time believed: a private network behind a balancer that
    /// // hides client addresses.
    /// let layer = DeadlineLayer::builder().trust(Trust::everyone()).build()?;
    /// # drop(layer);
    /// # Ok::<(), overload_core::ConfigError>(())
    /// ```
    pub fn trust(mut self, trust: Trust) -> Self {
        self.trust = Some(trust);
        self
    }

    /// Where the layer reads the time of day, to place a send time. Default: the operating
    /// system's ([`SystemWallClock`](overload_core::clock::SystemWallClock)); a simulation
    /// under tokio's paused time passes a
    /// [`TokioWallClock`](overload_core::clock::TokioWallClock), and so does a test of clock
    /// skew.
    pub fn wall_clock(mut self, wall: impl WallClock) -> Self {
        self.settings.wall = Arc::new(wall);
        self
    }

    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that breaks one of the rules listed on
    /// [`DeadlineLayerBuilder`].
    pub fn build(mut self) -> Result<DeadlineLayer, ConfigError> {
        if let Some(name) = self.name.take() {
            self.settings.name = LayerName::new(name)?;
        }
        if self.settings.skew_allowance > DeadlineLayer::MAX_SKEW_ALLOWANCE {
            return Err(ConfigError::out_of_range(
                "skew_allowance",
                self.settings.skew_allowance,
                "at most 60s",
            ));
        }
        Ok(DeadlineLayer {
            state: Arc::new(DeadlineState::new(self.settings)),
            trust: self.trust,
        })
    }
}

impl fmt::Debug for DeadlineLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineLayerBuilder")
            .field("name", &self.name)
            .field("skew_allowance", &self.settings.skew_allowance)
            .field("cancel_at_deadline", &self.settings.cancel_at_deadline)
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}
