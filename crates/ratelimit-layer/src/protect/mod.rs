//! The server's overload protection as one layer: `overload-signal`'s overload layer
//! **outside** a limiting layer, in that order whatever the server does with layers:
//! [`OverloadProtectionLayer`].
//!
//! # Why one layer
//!
//! The overload layer must see every request, the rejected ones included, so it goes
//! outside the limiter; under it, it never sees a rejection and never fires. But servers
//! nest `.layer` calls in opposite orders: axum's `Router::layer` wraps what is already there
//! (the **last** call is the outermost), while tonic's `Server::layer` and tower's
//! `ServiceBuilder` add layers from the outside in (the **first** call is the outermost).
//! Copying an axum stack onto tonic puts the overload layer under the limiter, where it
//! never fires. One layer that holds both, in the right order, cannot be put the wrong way
//! round:
//!
//! ```text
//! network ──► OverloadSignal ──► [Deadline] ──► limiting layer (RateLimit, ...) ──► service
//!             └────────────────── OverloadProtectionLayer ──────────────────┘
//! ```
//!
//! `overload-signal`'s deadline layer, when given one
//! ([`deadline`](OverloadProtectionLayerBuilder::deadline)), goes between the two: inside the
//! overload layer, whose histogram then sees every request, and outside the limit, so that a
//! request whose caller's deadline has passed is answered at once and spends no token.
//!
//! # What it wraps
//!
//! Any [`Layer`] whose service answers a rejection with a response (not an error) that
//! carries `overload-signal`'s [`Rejection`] marker in its extensions: every limit of this
//! crate ([`RateLimitLayer`](crate::RateLimitLayer), a Redis-backed limit, the
//! [adaptive limit](crate::adaptive)) as it is. Several limiting layers go in as one: a
//! tuple `(outer, inner)` (tower's `Layer` for tuples nests the first outermost) or a
//! `tower::ServiceBuilder`. The marker says why (rate limited, at capacity) and whom the
//! rejection concerns: one caller's own quota (a keyed limit's rejection, judged on that
//! caller's own retries) or the whole server. Only marked rejections become the stop signal,
//! and only those of a limit that is full (never a request refused for what it is: a missing
//! key, or a cost above the limit's capacity, answered `413`): a `429` or `503` the handler
//! makes, or an upstream's passed on, goes through untouched. A
//! limiter of your own inserts the marker in the rejections it makes; one you cannot change
//! is judged with `OverloadSignalLayer::builder().judge_every_rejection(true)`.
//!
//! # Who the callers are
//!
//! The overload layer tells callers apart by the peer address, which it reads from a
//! `SocketAddr` request extension: the plain contract every layer of this crate reads, put
//! there by the adapters of the features `axum-0_8`
//! (`axum_0_8::into_make_service_with_peer_addr`) and `tonic-0_14`
//! (`tonic_0_14::server_builder`), or by your own server code. So the examples below, and
//! the README's, need no key of their own. A server whose requests carry none is told so at
//! its first request, at `ERROR`, with the fix. Behind a load balancer, or
//! for a key of your own, pass the same `ClientIp` (trusted proxies included) to the limit
//! and to the overload layer.
//!
//! [`Rejection`]: https://docs.rs/overload-signal/0.1/overload_signal/signal/struct.Rejection.html
//!
//! # Each request's level
//!
//! The overload layer also resolves each request's criticality, as `overload-signal`'s
//! `CriticalityLayer` does, before the limit and without a layer of its own: the level the
//! request claims in `X-Request-Criticality`, capped for callers the protection does not
//! [trust](OverloadProtectionLayerBuilder::trust) (`critical` at most by default), or
//! `critical` when it claims none or a malformed one (never an error answer); a
//! `Criticality` already in the request's extensions is taken as it is. The level goes in
//! the request's extensions, where the limit inside reads it to shed from the bottom, and
//! the handler runs in it (`overload_signal::criticality::current()`), so that its
//! downstream calls through `backoff-layer`'s retry layer carry it. The settings are a
//! `CriticalityLayer`'s ([`criticality`](OverloadProtectionLayerBuilder::criticality)); it
//! is read in the same pass over the request's header names as the overload and deadline
//! layers' fields, and carried in the scope the overload layer installs anyway.
//!
//! # Examples
//!
//! With the defaults (the default overload layer) around a token bucket, in axum:
//!
//! ```
//! use axum::{Router, routing::get};
//! use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
//!
//! # fn main() -> Result<(), ratelimit_layer::ConfigError> {
//! let protection =
//!     OverloadProtectionLayer::new(RateLimitLayer::new(TokenBucket::new(100)?));
//! let app: Router = Router::new()
//!     .route("/api", get(|| async { "hello" }))
//!     .layer(protection);
//! # drop(app);
//! # Ok(())
//! # }
//! ```
//!
//! Served with the peer address in every request:
//! `axum::serve(listener, axum_0_8::into_make_service_with_peer_addr(app))` (feature
//! `axum-0_8`). The same in tonic, `tonic_0_14::server_builder().layer(protection)` (feature
//! `tonic-0_14`); `tests/readme_setups.rs` runs both. Customised: a per-client-IP limit, an
//! overload layer that tells callers apart by the same address, only the callers of the
//! fleet's own network trusted, and the deadline layer
//! between them, so that requests whose callers stopped waiting are dropped before the
//! limit:
//!
//! ```
//! use overload_signal::signal::IpNet;
//! use overload_signal::{DeadlineLayer, OverloadSignalLayer, Trust};
//! use ratelimit_layer::key::ClientIp;
//! use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
//!
//! # fn main() -> Result<(), ratelimit_layer::ConfigError> {
//! let client_ip = ClientIp::new();
//! let limit = RateLimitLayer::builder(TokenBucket::builder(20).burst(40).build()?)
//!     .key_by_client_ip(client_ip.clone())
//!     .build()?;
//! let signal = OverloadSignalLayer::builder().key_by(client_ip).build()?;
//! let protection = OverloadProtectionLayer::builder(limit)
//!     .signal(signal)
//!     .deadline(DeadlineLayer::new())
//!     // Whose attempt counters and deadlines' send times count, for both layers: the
//!     // fleet's own network (the default trusts every private network).
//!     .trust(Trust::networks([IpNet::new([10, 20, 0, 0].into(), 16)?]))
//!     .build()?;
//! # drop(protection);
//! # Ok(())
//! # }
//! ```

use std::fmt;

use overload_core::clock::{Clock, TokioClock};
use overload_signal::signal::TrustedProxies;
use overload_signal::{CriticalityLayer, DeadlineLayer, OverloadSignalLayer, Trust};
use tower_layer::{Identity, Layer};

mod slot;

pub use slot::DeadlineSlot;

/// `overload-signal`'s [`OverloadSignalLayer`] outside the limiting layer `L`, as one layer;
/// see the [module docs](crate::protect) for why, and for what `L` may be. With
/// [`deadline`](OverloadProtectionLayerBuilder::deadline), `overload-signal`'s
/// [`DeadlineLayer`] goes between them (`D`; no layer, [`Identity`], by default).
///
/// Its service is the overload layer's service around the limiter's:
/// `OverloadSignal<L::Service>`; with a deadline layer, `overload-signal`'s
/// `SignalDeadline<L::Service>`, the overload and deadline layers as one service, which
/// behaves as the two stacked and costs less per request. Cheap to clone when `L` is (the
/// overload layer's clones share its histogram); `Clone + Send + Sync` when `L` is, so it
/// fits axum's `Router::layer` and tonic's `Server::layer`.
///
/// Defaults ([`new`](Self::new), [`builder`](Self::builder)): `OverloadSignalLayer::new()`,
/// whose defaults its docs state (a 10-second window, the stop signal above 5 % retry
/// pressure over at least 200 requests, callers keyed by the peer address axum, tonic or
/// hyper put in the request, only marked rejections judged); each request's level resolved
/// with `CriticalityLayer::new()`'s settings (`critical` when it claims none, untrusted
/// callers capped at `critical`, callers on private networks trusted).
///
/// [`OverloadSignalLayer`]: https://docs.rs/overload-signal/0.1/overload_signal/signal/struct.OverloadSignalLayer.html
/// [`DeadlineLayer`]: https://docs.rs/overload-signal/0.1/overload_signal/deadline/struct.DeadlineLayer.html
#[derive(Clone)]
pub struct OverloadProtectionLayer<L, C: Clock = TokioClock, D = Identity> {
    /// NOTE: it carries the criticality settings (`with_criticality`): it resolves levels.
    signal: OverloadSignalLayer<C>,
    criticality: CriticalityLayer,
    deadline: D,
    limit: L,
}

impl<L> OverloadProtectionLayer<L> {
    /// The default overload layer outside `limit`.
    pub fn new(limit: L) -> Self {
        let criticality = CriticalityLayer::new();
        Self {
            signal: OverloadSignalLayer::new().with_criticality(criticality.clone()),
            criticality,
            deadline: Identity::new(),
            limit,
        }
    }

    /// A builder for a protection around `limit`, starting from the defaults of
    /// [`new`](Self::new).
    pub fn builder(limit: L) -> OverloadProtectionLayerBuilder<L> {
        OverloadProtectionLayerBuilder {
            signal: OverloadSignalLayer::new(),
            deadline: Identity::new(),
            limit,
            proxies: None,
            trust: None,
            criticality: None,
        }
    }
}

impl<L, C: Clock, D> OverloadProtectionLayer<L, C, D> {
    /// The overload layer, outside; its `histogram()` reads the window.
    pub const fn signal(&self) -> &OverloadSignalLayer<C> {
        &self.signal
    }

    /// The settings with which the overload layer resolves each request's level.
    pub const fn criticality(&self) -> &CriticalityLayer {
        &self.criticality
    }

    /// The deadline layer, between the two ([`Identity`] when there is none).
    pub const fn deadline(&self) -> &D {
        &self.deadline
    }

    /// The limiting layer, inside.
    pub const fn limit(&self) -> &L {
        &self.limit
    }
}

impl<S, L, C, D> Layer<S> for OverloadProtectionLayer<L, C, D>
where
    L: Layer<S>,
    D: DeadlineSlot,
    C: Clock,
{
    type Service = D::Protected<L::Service, C>;

    fn layer(&self, inner: S) -> Self::Service {
        // NOTE: the one place the order is decided: the limiter wraps the service, the
        // deadline layer wraps the limiter (an expired request spends no token), the
        // overload layer wraps both (its histogram sees every request, the expired ones
        // included, and every rejection).
        self.deadline.protect(&self.signal, self.limit.layer(inner))
    }
}

impl<L: fmt::Debug, C: Clock, D: fmt::Debug> fmt::Debug for OverloadProtectionLayer<L, C, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadProtectionLayer")
            .field("signal", &self.signal)
            .field("deadline", &self.deadline)
            .field("limit", &self.limit)
            .field("criticality", &self.criticality)
            .finish()
    }
}

/// Builds an [`OverloadProtectionLayer`]; from [`OverloadProtectionLayer::builder`]. Its
/// parts are layers, already validated; [`build`](Self::build) checks only that no setting
/// of this builder silently replaces one of theirs.
#[must_use]
pub struct OverloadProtectionLayerBuilder<L, C: Clock = TokioClock, D = Identity> {
    signal: OverloadSignalLayer<C>,
    deadline: D,
    limit: L,
    proxies: Option<TrustedProxies>,
    trust: Option<Trust>,
    criticality: Option<CriticalityLayer>,
}

impl<L, C: Clock, D> OverloadProtectionLayerBuilder<L, C, D> {
    /// The overload layer to put outside the limit. Default: `OverloadSignalLayer::new()`.
    /// Keep a clone of it (or call [`OverloadProtectionLayer::signal`]) to read its
    /// histogram.
    pub fn signal<C2: Clock>(
        self,
        signal: OverloadSignalLayer<C2>,
    ) -> OverloadProtectionLayerBuilder<L, C2, D> {
        OverloadProtectionLayerBuilder {
            signal,
            deadline: self.deadline,
            limit: self.limit,
            proxies: self.proxies,
            trust: self.trust,
            criticality: self.criticality,
        }
    }

    /// `overload-signal`'s deadline layer, to put between the overload layer and the limit:
    /// a request whose caller's deadline has passed is answered at once (`504`, gRPC
    /// `DEADLINE_EXCEEDED`) without spending a token of the limit, and the overload layer's
    /// histogram still sees it. Default: none.
    pub fn deadline(
        self,
        deadline: DeadlineLayer,
    ) -> OverloadProtectionLayerBuilder<L, C, DeadlineLayer> {
        OverloadProtectionLayerBuilder {
            signal: self.signal,
            deadline,
            limit: self.limit,
            proxies: self.proxies,
            trust: self.trust,
            criticality: self.criticality,
        }
    }

    /// Trusts the load balancers `proxies` to say who the client is, for the **whole
    /// protection**: the overload layer resolves each request's client from the header they
    /// write (and from nobody else's), keys its callers by it, and leaves it in the request
    /// for the limit inside, whose per-client key ([`ClientIp`](crate::key::ClientIp)) uses
    /// it. Default: no proxy trusted (every request keyed by its peer address: behind a
    /// balancer, all of them by the balancer's).
    ///
    /// Not together with proxies set on the layer given to [`signal`](Self::signal):
    /// [`build`](Self::build) refuses that rather than replace one set with the other.
    ///
    /// ```
    /// use ratelimit_layer::key::{ClientIp, ForwardedHeader, TrustedProxies};
    /// use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
    ///
    /// // 20 req/s per client, behind HAProxy at 10.0.0.2 (`option forwardfor`).
    /// let limit = RateLimitLayer::builder(TokenBucket::new(20)?)
    ///     .key_by_client_ip(ClientIp::new())
    ///     .build()?;
    /// let balancer = TrustedProxies::new(ForwardedHeader::XForwardedFor, ["10.0.0.2".parse()?])?;
    /// let protection = OverloadProtectionLayer::builder(limit)
    ///     .trusted_proxies(balancer)
    ///     .build()?;
    /// # drop(protection);
    /// # Ok::<(), ratelimit_layer::ConfigError>(())
    /// ```
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies = Some(proxies);
        self
    }

    /// Whose word the protection takes, for **both** layers that read what callers write:
    /// the overload layer counts the attempt counters of `trust`'s callers only, and the
    /// deadline layer (when there is one) believes only their deadlines' send times.
    /// Default: each layer's own, which is [`Trust::private_networks`] unless it was built
    /// with another: callers on private, loopback and link-local networks, so that a server
    /// on the Internet takes no client's word, and one inside a private network needs no
    /// configuration (see [`overload_signal::trust`]).
    ///
    /// Not together with a trust set on the layer given to [`signal`](Self::signal) or to
    /// [`deadline`](Self::deadline): [`build`](Self::build) refuses that rather than
    /// replace one with the other.
    ///
    /// ```
    /// use overload_signal::{DeadlineLayer, Trust};
    /// use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
    ///
    /// // A public API whose callers' counters and send times never count.
    /// let protection = OverloadProtectionLayer::builder(RateLimitLayer::new(TokenBucket::new(100)?))
    ///     .deadline(DeadlineLayer::new())
    ///     .trust(Trust::nobody())
    ///     .build()?;
    /// # drop(protection);
    /// # Ok::<(), ratelimit_layer::ConfigError>(())
    /// ```
    pub fn trust(mut self, trust: Trust) -> Self {
        self.trust = Some(trust);
        self
    }

    /// How the overload layer resolves each request's level: `criticality`'s settings (its
    /// default level, its cap for untrusted callers, its trust and its name), applied by the
    /// overload layer itself (see the [module docs](crate::protect#each-requests-level));
    /// `criticality` is not stacked as a layer. Default: `CriticalityLayer::new()`
    /// (`critical` for a request that claims no level, untrusted callers capped at
    /// `critical`).
    ///
    /// [`trust`](Self::trust) set here reaches it too; not together with a trust set on
    /// `criticality` ([`build`](Self::build) refuses that), nor with an overload layer given
    /// to [`signal`](Self::signal) that resolves levels already.
    ///
    /// ```
    /// use overload_signal::CriticalityLayer;
    /// use overload_signal::protocol::Criticality;
    /// use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
    ///
    /// // A batch service: requests that claim nothing are sheddable; nobody outside the
    /// // trusted networks gets more than sheddable-plus.
    /// let levels = CriticalityLayer::builder()
    ///     .default_level(Criticality::Sheddable)
    ///     .untrusted_max(Criticality::SheddablePlus)
    ///     .build()?;
    /// let protection = OverloadProtectionLayer::builder(RateLimitLayer::new(TokenBucket::new(100)?))
    ///     .criticality(levels)
    ///     .build()?;
    /// assert_eq!(protection.criticality().default_level(), Criticality::Sheddable);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn criticality(mut self, criticality: CriticalityLayer) -> Self {
        self.criticality = Some(criticality);
        self
    }

    /// Builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`](crate::ConfigError) of kind `Conflict` on `trusted_proxies` when
    /// they are set here and on the layer given to [`signal`](Self::signal) too, and on
    /// `trust` when it is set here and on the layer given to `signal` or to
    /// [`deadline`](Self::deadline) or to [`criticality`](Self::criticality); on
    /// `criticality` when it is set here and the layer given to `signal` resolves levels
    /// already.
    pub fn build(self) -> Result<OverloadProtectionLayer<L, C, D>, crate::ConfigError>
    where
        D: DeadlineSlot,
    {
        let signal = match self.proxies {
            Some(proxies) => {
                if let Some(theirs) = self.signal.trusted_proxies() {
                    return Err(crate::ConfigError::conflict(
                        "trusted_proxies",
                        format_args!(
                            "trusted_proxies set on this builder ({proxies:?}) and on the overload layer \
                             given to `signal` ({theirs:?}): set them once"
                        ),
                    ));
                }
                self.signal.with_trusted_proxies(proxies)
            }
            None => self.signal,
        };
        // NOTE: an overload layer that resolves levels already keeps its settings, unless
        // this builder was given its own: set once, as the trust is.
        let criticality = match (self.criticality, signal.criticality()) {
            (Some(_), Some(theirs)) => {
                return Err(crate::ConfigError::conflict(
                    "criticality",
                    format_args!(
                        "criticality set on this builder and on the overload layer given to \
                         `signal` ({theirs:?}): set it once"
                    ),
                ));
            }
            (Some(ours), None) => ours,
            (None, Some(theirs)) => theirs,
            (None, None) => CriticalityLayer::new(),
        };
        let (signal, deadline, criticality) = match self.trust {
            Some(trust) => {
                if let Some(theirs) = signal.trust() {
                    return Err(trust_conflict(
                        &trust,
                        "overload layer given to `signal`",
                        theirs,
                    ));
                }
                if let Some(theirs) = self.deadline.trust_set() {
                    return Err(trust_conflict(
                        &trust,
                        "deadline layer given to `deadline`",
                        theirs,
                    ));
                }
                if let Some(theirs) = criticality.trust_setting() {
                    return Err(trust_conflict(
                        &trust,
                        "criticality layer given to `criticality`",
                        theirs,
                    ));
                }
                let criticality = criticality.with_trust(trust.clone());
                (
                    signal.with_trust(trust.clone()),
                    self.deadline.with_trust(trust),
                    criticality,
                )
            }
            None => (signal, self.deadline, criticality),
        };
        Ok(OverloadProtectionLayer {
            signal: signal.with_criticality(criticality.clone()),
            criticality,
            deadline,
            limit: self.limit,
        })
    }
}

fn trust_conflict(ours: &Trust, whose: &str, theirs: &Trust) -> crate::ConfigError {
    crate::ConfigError::conflict(
        "trust",
        format_args!(
            "trust set on this builder ({ours:?}) and on the {whose} ({theirs:?}): set it once"
        ),
    )
}

impl<L: fmt::Debug, C: Clock, D: fmt::Debug> fmt::Debug
    for OverloadProtectionLayerBuilder<L, C, D>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadProtectionLayerBuilder")
            .field("signal", &self.signal)
            .field("deadline", &self.deadline)
            .field("limit", &self.limit)
            .field("trusted_proxies", &self.proxies)
            .field("trust", &self.trust)
            .field("criticality", &self.criticality)
            .finish()
    }
}

#[cfg(test)]
mod tests;
