use std::fmt;
use std::sync::Arc;

use overload_core::ConfigError;
use overload_core::clock::Clock;
use overload_core::telemetry::LayerName;
use tower_layer::Layer;

use super::service::CriticalityService;
use crate::OverloadSignalLayer;
use crate::protocol::{Criticality, RequestFields};
use crate::signal::levels::CriticalitySettings;
use crate::signal::trust::Trust;

/// Sets the [`Criticality`] of every request: the level it claims in
/// `X-Request-Criticality`, capped for callers the server does not trust, or the server's
/// default; and runs the inner service in it. See the [module docs](crate::criticality).
///
/// Cheap to clone: the services it makes share its settings and metrics.
///
/// Defaults ([`CriticalityLayer::new`]):
///
/// - a request without a level, or with a malformed one, is
///   [`Critical`](Criticality::Critical)
///   ([`default_level`](CriticalityLayerBuilder::default_level));
/// - a caller the server does not trust gets at most `Critical`
///   ([`untrusted_max`](CriticalityLayerBuilder::untrusted_max)): only trusted callers reach
///   `CriticalPlus`;
/// - callers on private networks trusted ([`Trust::private_networks`]);
/// - named `"default"` in its metrics.
#[derive(Clone)]
pub struct CriticalityLayer {
    settings: Arc<CriticalitySettings>,
}

impl CriticalityLayer {
    /// The layer with its defaults (listed on [`CriticalityLayer`]).
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the defaults are a valid configuration")
    }

    /// A builder that starts from the defaults.
    pub fn builder() -> CriticalityLayerBuilder {
        CriticalityLayerBuilder {
            name: None,
            default_level: Criticality::Critical,
            untrusted_max: Criticality::Critical,
            trust: None,
        }
    }

    /// The level of a request that carries none, or a malformed one.
    pub fn default_level(&self) -> Criticality {
        self.settings.default_level
    }

    /// The highest level a caller the server does not trust gets.
    pub fn untrusted_max(&self) -> Criticality {
        self.settings.untrusted_max
    }

    /// Whose claims are taken up to [`CriticalPlus`](Criticality::CriticalPlus).
    pub fn trust(&self) -> &Trust {
        &self.settings.trust
    }

    /// The layer's name: the `name` label of its metrics.
    pub fn name(&self) -> &LayerName {
        self.settings.name()
    }

    /// The trust set on the builder, `None` when the layer trusts the default
    /// ([`Trust::private_networks`]): what lets a setting that covers several layers
    /// (`ratelimit-layer`'s `OverloadProtectionLayerBuilder::trust`) refuse to replace one
    /// set here.
    pub fn trust_setting(&self) -> Option<&Trust> {
        self.settings.trust_set.then_some(&self.settings.trust)
    }

    /// The layer with the same settings and name, trusting `trust`'s callers instead.
    /// Its services made before are left as they were.
    #[must_use]
    pub fn with_trust(self, trust: Trust) -> Self {
        let settings = &*self.settings;
        Self {
            settings: Arc::new(CriticalitySettings::new(
                settings.name().clone(),
                settings.default_level,
                settings.untrusted_max,
                Some(trust),
            )),
        }
    }

    /// The level of `request`, as the layer's services set it: what a layer of the user's
    /// own that sits outside this one and must know the level calls.
    ///
    /// ```
    /// use http::Request;
    /// use overload_signal::criticality::CriticalityLayer;
    /// use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};
    ///
    /// let layer = CriticalityLayer::new();
    /// // No client address in the extensions: not trusted, so capped at `critical`.
    /// let request = Request::builder()
    ///     .header(X_REQUEST_CRITICALITY, "critical-plus")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(layer.level_of(&request), Criticality::Critical);
    /// ```
    pub fn level_of<B>(&self, request: &http::Request<B>) -> Criticality {
        self.settings.resolve(
            request.headers(),
            request.extensions(),
            RequestFields::of(request.headers()),
        )
    }
}

// NOTE: the overload layer's methods that take a `CriticalityLayer` live here, so that
// `signal` never imports `criticality` (which imports `signal`'s trust).
impl<C: Clock> OverloadSignalLayer<C> {
    /// The layer resolving each request's [`Criticality`](crate::protocol::Criticality) as `criticality`'s services do
    /// (the level it claims in `X-Request-Criticality`, capped for callers `criticality`
    /// does not trust, or its default; a level already in the request's extensions taken
    /// as it is), in the same pass over the request's headers as its own fields: the level
    /// is put in the request's extensions for the layers inside (every limit of
    /// `ratelimit-layer` reads it there), and the inner service runs in it
    /// ([`criticality::current`](crate::criticality::current)), as behind a
    /// [`CriticalityLayer`]. `ratelimit-layer`'s `OverloadProtectionLayer` does this with
    /// the defaults of [`CriticalityLayer::new`] unless told otherwise. Default: none (the
    /// layer reads the level an outer [`CriticalityLayer`] put in the request, for its
    /// metrics and its stop rule, and `critical` when there is none).
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use overload_signal::criticality::{self, CriticalityLayer};
    /// use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};
    /// use overload_signal::OverloadSignalLayer;
    /// use tower::{Layer, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = OverloadSignalLayer::new().with_criticality(CriticalityLayer::new());
    /// let service = layer.layer(service_fn(|request: Request<()>| async move {
    ///     let level = Some(Criticality::of(request.extensions()));
    ///     assert_eq!(level, criticality::current());
    ///     Ok::<_, Infallible>(Response::new(level))
    /// }));
    /// let request = Request::builder().header(X_REQUEST_CRITICALITY, "sheddable").body(()).unwrap();
    /// let answer = service.oneshot(request).await.unwrap();
    /// assert_eq!(*answer.body(), Some(Criticality::Sheddable));
    /// # }
    /// ```
    #[must_use]
    pub fn with_criticality(mut self, criticality: CriticalityLayer) -> Self {
        self.criticality = Some(criticality.settings);
        self
    }

    /// The settings of the levels this layer resolves, if any (see
    /// [`with_criticality`](Self::with_criticality)): a `CriticalityLayer` that shares them.
    pub fn criticality(&self) -> Option<CriticalityLayer> {
        self.criticality.as_ref().map(|settings| CriticalityLayer {
            settings: Arc::clone(settings),
        })
    }
}

impl Default for CriticalityLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for CriticalityLayer {
    type Service = CriticalityService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CriticalityService::new(inner, Arc::clone(&self.settings))
    }
}

impl fmt::Debug for CriticalityLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriticalityLayer")
            .field("name", self.name())
            .field("default_level", &self.settings.default_level)
            .field("untrusted_max", &self.settings.untrusted_max)
            .field("trust", &self.settings.trust)
            .finish()
    }
}

/// Builds a [`CriticalityLayer`]; made by [`CriticalityLayer::builder`]. Every setting
/// starts at its default; [`build`](Self::build) checks that the name is 1 to 128 bytes of
/// printable ASCII.
#[must_use = "a builder does nothing until `build` is called"]
pub struct CriticalityLayerBuilder {
    name: Option<String>,
    default_level: Criticality,
    untrusted_max: Criticality,
    trust: Option<Trust>,
}

impl CriticalityLayerBuilder {
    /// What the layer calls itself: the label `name` of its metrics. Default: `"default"`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The level of a request that carries none, or a malformed one (capped like a claim for
    /// an untrusted caller). Default: [`Critical`](Criticality::Critical), the level of
    /// serving traffic, so that a fleet where nobody sets a level sheds as before.
    pub const fn default_level(mut self, level: Criticality) -> Self {
        self.default_level = level;
        self
    }

    /// The highest level a caller the server does not [trust](Self::trust) gets, whatever it
    /// claims. Default: [`Critical`](Criticality::Critical): a client on the Internet cannot
    /// claim `critical-plus` to jump the queue. `Sheddable` sheds every untrusted caller
    /// before any trusted one.
    pub const fn untrusted_max(mut self, level: Criticality) -> Self {
        self.untrusted_max = level;
        self
    }

    /// Whose claims are taken as they are. Default: [`Trust::private_networks`] (see
    /// [`trust`](crate::signal::trust)); `ratelimit-layer`'s
    /// `OverloadProtectionLayerBuilder::trust` sets it with the other layers' trust.
    pub fn trust(mut self, trust: Trust) -> Self {
        self.trust = Some(trust);
        self
    }

    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the name is empty, longer than 128 bytes or not printable
    /// ASCII.
    pub fn build(self) -> Result<CriticalityLayer, ConfigError> {
        let name = match self.name {
            Some(name) => LayerName::new(name)?,
            None => LayerName::default(),
        };
        Ok(CriticalityLayer {
            settings: Arc::new(CriticalitySettings::new(
                name,
                self.default_level,
                self.untrusted_max,
                self.trust,
            )),
        })
    }
}

impl fmt::Debug for CriticalityLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriticalityLayerBuilder")
            .field("name", &self.name)
            .field("default_level", &self.default_level)
            .field("untrusted_max", &self.untrusted_max)
            .field("trust", &self.trust)
            .finish()
    }
}
