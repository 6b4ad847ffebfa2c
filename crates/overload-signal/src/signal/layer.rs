use std::any::TypeId;
use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::LayerName;

use super::callers::{self, CallerKey};
use super::levels::CriticalitySettings;
use super::peer::PeerIp;
use super::proxies::TrustedProxies;
use super::rule::StopRule;
use super::service::OverloadSignal;
use super::state::{SignalSettings, SignalState};
use super::trust::Trust;
use crate::histogram::AttemptHistogram;

/// Applies [`OverloadSignal`] to a service: records every request's attempt counter, turns
/// rejections into the stop signal when the fleet is drowning in retries, and propagates a
/// downstream stop signal. See the [module docs](crate::signal).
///
/// Every service this layer makes shares one histogram, so an axum `Router::layer` (which
/// wraps each route) still judges the whole server's traffic. Cheap to clone; clones share
/// the histogram too. `C` is the histogram's clock.
///
/// Defaults ([`OverloadSignalLayer::new`], [`OverloadSignalLayer::builder`]):
///
/// - the default [`AttemptHistogram`]: 10 seconds in 10 buckets of 1 second, the paper's and
///   the SRE book's retry-budget window;
/// - the default [`StopRule`]: retry pressure above 5 % (half the usual 10 % client budget)
///   with at least 200 requests in the window, sustained while the server keeps rejecting;
/// - callers keyed by their peer's IP address ([`PeerIp`](super::PeerIp)), each caller class
///   weighing at most as much as the median class in the decision (see the
///   [module docs](crate::signal#trust-what-callers-can-and-cannot-do));
/// - the attempt counters of callers on private networks count, and no one else's
///   ([`Trust::private_networks`]);
/// - no proxy trusted: forwarding headers are ignored, and callers behind a load balancer
///   all have its address until it is trusted
///   ([`trusted_proxies`](OverloadSignalLayerBuilder::trusted_proxies));
/// - only rejections a limiting layer marked with a [`Rejection`](super::Rejection) are
///   judged: the application's own `429`/`503` pass untouched;
/// - named `"default"` ([`LayerName::DEFAULT`]) in its metrics and logs: name each layer
///   when a process has more than one.
pub struct OverloadSignalLayer<C: Clock = TokioClock> {
    state: Arc<SignalState<C>>,
    /// NOTE: kept apart from `state` so that `with_trusted_proxies` can set it on a built
    /// layer (what `ratelimit-layer`'s `OverloadProtectionLayerBuilder` does) and keep the
    /// histogram shared.
    proxies: Option<TrustedProxies>,
    /// Whose counters count; `None`: the default, not set (kept apart for the same reason,
    /// and so that a second setting is refused).
    trust: Option<Trust>,
    /// The settings of the levels this layer resolves, if any (see
    /// `OverloadSignalLayer::with_criticality`, in the `criticality` module).
    pub(crate) criticality: Option<Arc<CriticalitySettings>>,
}

impl OverloadSignalLayer {
    /// How many classes the layer hashes caller keys into: 128; requests without a key make
    /// one class more.
    ///
    /// The decision weighs each class at most as much as the median class, so the more
    /// classes are in use, the less any one caller can do: with callers spread over every
    /// class, one class moves the per-caller pressure by about 0.8 % (1.6 % at worst), and
    /// up to six forging callers cannot reach the default 5 % threshold alone. Each class
    /// costs two counters per bucket and stripe (about 33 KiB per stripe in all, with the
    /// default window), and the per-caller figure reads them all, at most once per bucket
    /// and per sixteenth of growth of the window. This crate's choice.
    pub const CALLER_CLASSES: usize = callers::CLASSES;

    /// A layer with the defaults: the default [`AttemptHistogram`] and [`StopRule`], callers
    /// keyed by [`PeerIp`](super::PeerIp), callers on private networks trusted, named
    /// `"default"`.
    pub fn new() -> Self {
        Self {
            state: Arc::new(SignalState::new(SignalSettings::new())),
            proxies: None,
            trust: None,
            criticality: None,
        }
    }

    /// A builder that starts from the defaults.
    pub fn builder() -> OverloadSignalLayerBuilder {
        OverloadSignalLayerBuilder {
            name: None,
            settings: SignalSettings::new(),
            proxies: None,
            trust: None,
        }
    }
}

impl Default for OverloadSignalLayer {
    /// The same as [`OverloadSignalLayer::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> OverloadSignalLayer<C> {
    /// The histogram this layer records into.
    pub fn histogram(&self) -> &AttemptHistogram<C> {
        &self.state.histogram
    }

    /// The rule this layer decides with now: the builder's, or the last one given to
    /// [`set_rule`](Self::set_rule).
    pub fn rule(&self) -> StopRule {
        **self.state.rule.load()
    }

    /// Replaces the rule while serving, for this layer and every clone of it and every
    /// service it made: the next rejection is judged by `rule`. Nothing else changes: the
    /// histogram keeps its window of attempts, the caller ledger its classes, and a stop
    /// signal episode in progress goes on or ends by the new rule's verdict on the next
    /// rejection. A decision in progress finishes with the rule it started with.
    ///
    /// The rule is already checked by its builder; to change one setting, start from the rule
    /// in force with [`StopRule::to_builder`]. The change is logged at `INFO` with the old and
    /// the new settings.
    ///
    /// ```
    /// use overload_signal::{OverloadSignalLayer, StopRule};
    ///
    /// let layer = OverloadSignalLayer::new();
    /// let served = layer.clone(); // e.g. moved into the server's stack
    ///
    /// // Raise the threshold from 5 % to 10 % of retries, keeping the other settings.
    /// layer.set_rule(layer.rule().to_builder().retry_share(0.10).build()?);
    /// assert_eq!(served.rule().retry_share(), 0.10);
    /// assert_eq!(served.rule().min_requests(), StopRule::DEFAULT_MIN_REQUESTS);
    /// # Ok::<(), overload_core::ConfigError>(())
    /// ```
    pub fn set_rule(&self, rule: StopRule) {
        let old = self.state.rule.swap(Arc::new(rule));
        if *old != rule {
            tracing::info!(
                name = self.state.name().as_str(),
                old.retry_share = old.retry_share(),
                old.min_requests = old.min_requests(),
                old.sustain = old.sustain(),
                retry_share = rule.retry_share(),
                min_requests = rule.min_requests(),
                sustain = rule.sustain(),
                "stop rule changed"
            );
        }
    }

    /// The layer's name: the `name` label of its metrics and the `name` field of its logs.
    pub fn name(&self) -> &LayerName {
        self.state.name()
    }

    /// The proxies whose forwarding header this layer reads, if any (see
    /// [`OverloadSignalLayerBuilder::trusted_proxies`]).
    pub fn trusted_proxies(&self) -> Option<&TrustedProxies> {
        self.proxies.as_ref()
    }

    /// Whose attempt counters count: what [`OverloadSignalLayerBuilder::trust`] set, or
    /// `None` for the default ([`Trust::private_networks`]).
    pub fn trust(&self) -> Option<&Trust> {
        self.trust.as_ref()
    }

    /// This layer, its histogram and decision shared with the original, trusting the
    /// counters of `trust`'s callers instead: what [`OverloadSignalLayerBuilder::trust`]
    /// sets, for a layer already built (`ratelimit-layer`'s
    /// `OverloadProtectionLayerBuilder::trust` uses it).
    #[must_use]
    pub fn with_trust(mut self, trust: Trust) -> Self {
        self.trust = Some(trust);
        self
    }

    /// This layer, its histogram and decision shared with the original, trusting `proxies`
    /// instead of the proxies it was built with: what
    /// [`OverloadSignalLayerBuilder::trusted_proxies`] sets, for a layer already built
    /// (`ratelimit-layer`'s `OverloadProtectionLayerBuilder::trusted_proxies` uses it).
    #[must_use]
    pub fn with_trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies = Some(proxies);
        self
    }
}

impl<C: Clock> Clone for OverloadSignalLayer<C> {
    fn clone(&self) -> Self {
        Self {
            state: Arc::clone(&self.state),
            proxies: self.proxies.clone(),
            trust: self.trust.clone(),
            criticality: self.criticality.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for OverloadSignalLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadSignalLayer")
            .field("name", self.state.name())
            .field("histogram", &self.state.histogram)
            .field("rule", &self.rule())
            .field("trust", &self.trust)
            .field("trusted_proxies", &self.proxies)
            .field("criticality", &self.criticality)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> OverloadSignalLayer<C> {
    /// The settings of the levels this layer resolves, if any.
    pub(crate) fn criticality_settings(&self) -> Option<Arc<CriticalitySettings>> {
        self.criticality.clone()
    }

    /// What each service this layer makes holds: the shared state, the proxies, and the
    /// trust (the default when none was set).
    pub(crate) fn service_parts(&self) -> (Arc<SignalState<C>>, Option<TrustedProxies>, Trust) {
        (
            Arc::clone(&self.state),
            self.proxies.clone(),
            self.trust.clone().unwrap_or_default(),
        )
    }
}

impl<S, C: Clock> Layer<S> for OverloadSignalLayer<C> {
    type Service = OverloadSignal<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        let (state, proxies, trust) = self.service_parts();
        OverloadSignal::from_state(inner, state, proxies, trust, self.criticality_settings())
    }
}

/// Builds an [`OverloadSignalLayer`] from a name, a histogram and a rule (both already
/// validated), a caller key and a [`Trust`]; each starts at its default.
/// [`build`](Self::build) checks the name.
pub struct OverloadSignalLayerBuilder<C: Clock = TokioClock> {
    /// The name as set, checked by `build`; `None`: the default.
    name: Option<String>,
    settings: SignalSettings<C>,
    proxies: Option<TrustedProxies>,
    trust: Option<Trust>,
}

impl<C: Clock> OverloadSignalLayerBuilder<C> {
    /// What the layer calls itself: the label `name` of every metric it writes, and the
    /// field `name` of every state change it logs, so that two layers in one process (two
    /// listeners, a public and an internal router) are told apart. Default: `"default"`
    /// ([`LayerName::DEFAULT`]): name your layers when a process has more than one.
    ///
    /// Must be 1 to 128 bytes of printable ASCII; [`build`](Self::build) checks it.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The histogram to record into. Default: [`AttemptHistogram::new`] (10 seconds in 10
    /// buckets, on tokio's clock).
    ///
    /// Keep a clone of it to read its [`snapshot`](AttemptHistogram::snapshot) elsewhere (a
    /// status page, a test); [`OverloadSignalLayer::histogram`] returns it too.
    pub fn histogram<C2: Clock>(
        self,
        histogram: AttemptHistogram<C2>,
    ) -> OverloadSignalLayerBuilder<C2> {
        OverloadSignalLayerBuilder {
            name: self.name,
            settings: self.settings.with_histogram(histogram),
            proxies: self.proxies,
            trust: self.trust,
        }
    }

    /// The rule that decides when a rejection becomes the stop signal. Default:
    /// [`StopRule::new`] (retry pressure above 5 % with at least 200 requests, sustained).
    pub fn rule(mut self, rule: StopRule) -> Self {
        self.settings.rule = rule;
        self
    }

    /// What identifies a request's caller: a [`CallerKey`], such as a closure
    /// `|parts: &Parts| -> Option<K>`, or `ratelimit-layer`'s `ClientIp` (the same key as a
    /// per-client limit, trusted proxies included). Default: [`PeerIp`](super::PeerIp), the
    /// peer's IP address, from the `SocketAddr` extension the server put in the request
    /// ([`peer_addr`](super::peer_addr), which says how axum and tonic servers put it there).
    ///
    /// The layer hashes keys into [`OverloadSignalLayer::CALLER_CLASSES`] classes and
    /// bounds what one class weighs in the decision, so that no small set of callers can make
    /// it (see the [module docs](crate::signal#trust-what-callers-can-and-cannot-do)).
    /// Requests without a key form one class of their own: each is counted in
    /// `overload_signal_unkeyed_requests_total`, and logged at the first and then at most
    /// once a minute while they keep coming: at `ERROR`, with the fix, when the request
    /// carries no peer address at all (see [the peer address](super#the-peer-address)), at
    /// `WARN` when a key of your own found none.
    pub fn key_by<K: CallerKey>(mut self, key: K) -> Self {
        // NOTE: the default key given again stays the default, which the layer reads without
        // a call through `dyn` (the same classes either way).
        self.settings.key = if TypeId::of::<K>() == TypeId::of::<PeerIp>() {
            None
        } else {
            Some(Arc::new(key))
        };
        self
    }

    /// Whose attempt counters count: a request that claims to be a retry, from a caller
    /// `trust` does not trust, is recorded as if it carried no counter (it counts towards the
    /// window's requests and dilutes the pressure, never as a retry). Default: [`Trust::private_networks`]: the
    /// callers on private, loopback and link-local networks who did not come through a
    /// proxy from elsewhere, so that a server on the Internet takes no client's word for a
    /// retry, and one inside a private network needs no configuration (see
    /// [`trust`](crate::signal::trust)).
    ///
    /// The same setting decides whose deadlines' send times the deadline layer believes;
    /// `ratelimit-layer`'s `OverloadProtectionLayerBuilder::trust` sets both at once.
    ///
    /// ```
    /// use overload_signal::signal::IpNet;
    /// use overload_signal::{OverloadSignalLayer, Trust};
    ///
    /// // Only the callers of the fleet's own network, 10.20.0.0/16, can make the server say
    /// // "stop".
    /// let layer = OverloadSignalLayer::builder()
    ///     .trust(Trust::networks([IpNet::new([10, 20, 0, 0].into(), 16)?]))
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), overload_core::ConfigError>(())
    /// ```
    pub fn trust(mut self, trust: Trust) -> Self {
        self.trust = Some(trust);
        self
    }

    /// Trusts the load balancers (or any reverse proxies) `proxies` to say who the client is:
    /// for a request whose peer is one of them, the client is the address they forward
    /// (`X-Forwarded-For` or `Forwarded`, read right to left past every trusted hop; see
    /// [`TrustedProxies`]). Default: no proxy trusted, forwarding headers ignored.
    ///
    /// **One setting for the whole server.** The layer resolves each request's client once,
    /// before anything else, and leaves it in the request as a
    /// [`ClientAddr`](super::ClientAddr): the default caller key ([`PeerIp`](super::PeerIp))
    /// keys by it, and so does every layer inside this one that reads
    /// [`client_addr`](super::client_addr), such as `ratelimit-layer`'s `ClientIp` (a
    /// per-client limit, whose own proxy setting is then not needed). A header from any
    /// other peer is never read: a client that connects past the balancer, or sends its
    /// own `X-Forwarded-For` through it, is keyed by the address the balancer saw.
    ///
    /// Behind a balancer without this setting every request has the balancer's address, so
    /// all callers share one caller class and one client that forges its attempt counter
    /// can make the server tell everyone to stop (see the
    /// [module docs](crate::signal#trust-what-callers-can-and-cannot-do)).
    ///
    /// ```
    /// use overload_signal::OverloadSignalLayer;
    /// use overload_signal::signal::{ForwardedHeader, TrustedProxies};
    ///
    /// // HAProxy at 10.0.0.2 and 10.0.0.3 with `option forwardfor`.
    /// let proxies = TrustedProxies::new(
    ///     ForwardedHeader::XForwardedFor,
    ///     ["10.0.0.2".parse()?, "10.0.0.3".parse()?],
    /// )?;
    /// let layer = OverloadSignalLayer::builder().trusted_proxies(proxies).build()?;
    /// # drop(layer);
    /// # Ok::<(), overload_core::ConfigError>(())
    /// ```
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies = Some(proxies);
        self
    }

    /// Whether rejections that no limiting layer marked are judged too. Default: `false`:
    /// only a rejection carrying a [`Rejection`](super::Rejection) in its extensions (which
    /// every limit of `ratelimit-layer` inserts, and a limiter of your own can) may become
    /// the stop signal; a `429` or `503` your handler makes, or an upstream's that a gateway
    /// passes on, goes through untouched, headers and body included.
    ///
    /// `true` judges every HTTP `429` and `503` and every gRPC `RESOURCE_EXHAUSTED` and
    /// `UNAVAILABLE` as the server's own rejection, as this layer did before it read the
    /// marker: for a limiter outside this workspace that cannot mark its answers. Under
    /// retry pressure such an answer then loses its `Retry-After` and `RateLimit` fields to
    /// the stop signal, whoever made it.
    pub const fn judge_every_rejection(mut self, judge: bool) -> Self {
        self.settings.judge_every = judge;
        self
    }

    /// Hashes caller keys into classes with a fixed key and `seed`, rather than a random key
    /// drawn for each layer, so that a test puts the same callers in the same classes on
    /// every run. Never in production: a caller who knows the key can aim at a class.
    #[cfg(any(test, feature = "test-util"))]
    pub fn caller_seed(mut self, seed: u64) -> Self {
        self.settings.hashing = callers::KeyHashing::seeded(seed);
        self
    }

    /// Builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the setting `name` when the name is empty, longer than 128
    /// bytes, or holds anything but printable ASCII. Every other setting was checked when
    /// it was built.
    pub fn build(mut self) -> Result<OverloadSignalLayer<C>, ConfigError> {
        if let Some(name) = self.name {
            self.settings.name = LayerName::new(name)?;
        }
        Ok(OverloadSignalLayer {
            state: Arc::new(SignalState::new(self.settings)),
            proxies: self.proxies,
            trust: self.trust,
            criticality: None,
        })
    }
}

impl<C: Clock> fmt::Debug for OverloadSignalLayerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadSignalLayerBuilder")
            .field("name", &self.name)
            .field("histogram", &self.settings.histogram)
            .field("rule", &self.settings.rule)
            .field("trust", &self.trust)
            .field("judge_every_rejection", &self.settings.judge_every)
            .field("trusted_proxies", &self.proxies)
            .finish_non_exhaustive()
    }
}
