//! [`LimitsLayer`]: a limits file's limits in force, one rate limit per entry, changed while
//! serving when the file changes.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::TokioClock;
use overload_core::telemetry::LayerName;
use tower_layer::Layer;

use super::limits::{Limits, LimitsFileError};
use super::routes::{LimitsEntrySettings, LimitsState, LimitsTable};
use super::service::LimitsService;
use super::watch::{LimitsWatcher, Reloader};
use crate::key::ClientIp;
use crate::rate_limit::RateLimitLayer;

/// A rate limit per entry of a limits file (the default, each route, each tenant), each a
/// [`RateLimitLayer`] over a [`LiveTokenBucket`](crate::algorithm::LiveTokenBucket); a request is limited by the entry
/// [`Limits::entry_for`] picks (its tenant's, else its exact route's, else its longest
/// prefix's, else the default) and answered as by any [`RateLimitLayer`]: `429` with
/// `Retry-After`, `RateLimit-Policy` and `RateLimit` (gRPC `RESOURCE_EXHAUSTED`), marked for
/// an overload layer outside.
///
/// Each entry limits what its `key` says: each client IP address (`key = "ip"`, the
/// default of `[default]` and of the routes; the address comes from the layer's
/// [`ClientIp`], [`ClientIp::new`] by default: the `SocketAddr` request extension) or all its
/// requests together (`key = "global"`, the default of a tenant: one bucket per tenant).
///
/// # Changed while serving
///
/// [`apply`](Self::apply) puts new limits in force, and [`from_file`](Self::from_file)
/// (or [`LimitsLayerBuilder::watch`]) calls it each time the file changes (looked at every
/// 250 ms, [`LimitsWatcher::INTERVAL`]): an entry present before and after keeps its layer,
/// whose bucket takes the new rate, period and burst through its handle, with every key's
/// state carried over (nothing admitted in a burst, nothing the new limit admits rejected:
/// the rule of [`LiveTokenBucket`](crate::algorithm::LiveTokenBucket)); an added entry gets a new layer with fresh state; a
/// removed one is dropped, and its requests go to the entry that now matches them. An
/// entry whose `key` changed starts afresh. The routing table is one `Arc` swapped
/// lock-free: a request reads it with one atomic load. `RateLimit-Policy` follows the
/// change.
///
/// A file refused (see [`Reloader`]) changes nothing: the limits in force stay, the reason
/// is logged at `WARN` with the file's line and column, and
/// `ratelimit_layer_limits_reloads_total{name, result="refused"}` counts it.
///
/// The watcher thread lives as long as the layer: dropping the last clone of the layer and
/// of the services it made stops it.
///
/// # Metrics
///
/// Every entry writes the metrics of a [`RateLimitLayer`] under the layer's one `name`, so
/// the counters (requests, rejections) add up over the entries. The
/// `ratelimit_layer_keys` gauge is the exception, a known gap: each entry sets it to its
/// own count of keys, so it shows one entry's figure at a time, not the sum.
///
/// # Examples
///
/// From a file, watched, with the defaults (named `default`, client IP from the
/// `SocketAddr` extension):
///
/// ```no_run
/// use axum::{Router, routing::get};
/// use ratelimit_layer::limits_file::LimitsLayer;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = LimitsLayer::from_file("limits.toml", "api")?;
/// let app: Router = Router::new().route("/api", get(|| async { "hello" })).layer(limits);
/// # drop(app);
/// # Ok(())
/// # }
/// ```
///
/// Customised: trusting a load balancer for the client's address, the `RateLimit` fields on
/// admitted responses too, and limits set by the program:
///
/// ```
/// use ratelimit_layer::key::{ClientIp, ForwardedHeader, IpNet, TrustedProxies};
/// use ratelimit_layer::limits_file::{Limits, LimitsLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = Limits::parse("limits.toml", "[default]\nrate = 100\n")?;
/// let balancer = IpNet::new([10, 0, 0, 0].into(), 8)?;
/// let proxies = TrustedProxies::new(ForwardedHeader::XForwardedFor, [balancer])?;
/// let layer = LimitsLayer::builder()
///     .name("api")
///     .client_ip(ClientIp::builder().trusted_proxies(proxies).build()?)
///     .admitted_headers(true)
///     .build(&limits)?;
/// layer.apply(&Limits::parse("limits.toml", "[default]\nrate = 10\n")?)?;
/// assert_eq!(layer.current().limit_for("/", None).rate(), 10);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LimitsLayer {
    pub(super) shared: Arc<LimitsState>,
}

impl LimitsLayer {
    /// The limits of the file at `path`, in force now and whenever the file changes (looked
    /// at every [`LimitsWatcher::INTERVAL`]), in a layer named `name` (its metrics' `name`
    /// label, its logs' `name` field, its `RateLimit-Policy` name), with the defaults of
    /// [`LimitsLayer::builder`]. The same as `LimitsLayer::builder().name(name).watch(path)`.
    ///
    /// # Errors
    ///
    /// The file is refused (a server should not start with limits it cannot read; the
    /// error says where: `path:line:column`), or the name is invalid.
    pub fn from_file(
        path: impl AsRef<Path>,
        name: impl Into<String>,
    ) -> Result<Self, LimitsLayerError> {
        Self::builder().name(name).watch(path)
    }

    /// A builder with the defaults: named `default`
    /// ([`RateLimitLayer::DEFAULT_NAME`]), client addresses from [`ClientIp::new`], the
    /// `RateLimit` fields on rejections only, the file looked at every 250 ms
    /// ([`LimitsWatcher::INTERVAL`]).
    pub fn builder() -> LimitsLayerBuilder {
        LimitsLayerBuilder {
            name: RateLimitLayer::DEFAULT_NAME.to_owned(),
            client_ip: ClientIp::new(),
            admitted_headers: false,
            interval: LimitsWatcher::INTERVAL,
        }
    }

    /// Puts `limits` in force now: see the [type docs](Self) for what each entry keeps.
    ///
    /// # Errors
    ///
    /// Only if an entry's layer cannot be built, which the settings checked by the builder
    /// rule out; the limits in force then stay.
    pub fn apply(&self, limits: &Limits) -> Result<(), ConfigError> {
        self.shared.table.apply(limits)
    }

    /// The limits in force.
    pub fn current(&self) -> Limits {
        self.shared.table.routes.load().limits.clone()
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        self.shared.table.entries.name.as_str()
    }
}

impl<S> Layer<S> for LimitsLayer {
    type Service = LimitsService<S>;

    fn layer(&self, inner: S) -> LimitsService<S> {
        LimitsService::new(inner, Arc::clone(&self.shared))
    }
}

impl fmt::Debug for LimitsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitsLayer")
            .field("name", &self.name())
            .field("limits", &self.shared.table.routes.load().limits)
            .field("watching", &self.shared.watcher.is_some())
            .finish()
    }
}

/// Builds a [`LimitsLayer`]; from [`LimitsLayer::builder`].
#[derive(Debug)]
#[must_use]
pub struct LimitsLayerBuilder {
    name: String,
    client_ip: ClientIp,
    admitted_headers: bool,
    interval: Duration,
}

impl LimitsLayerBuilder {
    /// What the layer calls itself: the `name` label of its metrics (every entry's, and the
    /// reloads counter's), the `name` field of its logs, and the policy name of its
    /// `RateLimit-Policy` and `RateLimit` fields. Non-empty printable ASCII, at most 128
    /// bytes. Default: `default` ([`RateLimitLayer::DEFAULT_NAME`]).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Where the entries with `key = "ip"` find the client's address, trusted proxies
    /// included. Default: [`ClientIp::new`] (the `SocketAddr` request extension, no proxy
    /// trusted).
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = client_ip;
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` too (`429`
    /// rejections always do). Default: `false`, as [`RateLimitBuilder::admitted_headers`].
    ///
    /// [`RateLimitBuilder::admitted_headers`]: crate::RateLimitBuilder::admitted_headers
    pub const fn admitted_headers(mut self, enabled: bool) -> Self {
        self.admitted_headers = enabled;
        self
    }

    /// How often [`watch`](Self::watch) looks at the file. Default: 250 ms
    /// ([`LimitsWatcher::INTERVAL`]), so a change is in force within a second.
    pub const fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// A layer with `limits` in force, changed only by [`LimitsLayer::apply`].
    ///
    /// # Errors
    ///
    /// The name is invalid (kind `Invalid`), or the interval is zero (kind `OutOfRange`).
    pub fn build(self, limits: &Limits) -> Result<LimitsLayer, ConfigError> {
        Ok(LimitsLayer {
            shared: Arc::new(LimitsState {
                table: Arc::new(self.table(limits)?),
                watcher: None,
            }),
        })
    }

    /// A layer with the limits of the file at `path` in force, and a thread that looks at
    /// the file every [`interval`](Self::interval) and puts each new valid content in
    /// force ([`LimitsLayer::apply`]); see [`Reloader`] for what is logged and counted.
    ///
    /// # Errors
    ///
    /// The file is refused (with `path:line:column`), or a setting is invalid.
    pub fn watch(self, path: impl AsRef<Path>) -> Result<LimitsLayer, LimitsLayerError> {
        let reloader = Reloader::new(path, self.name.clone()).map_err(LimitsLayerError::File)?;
        let interval = self.interval;
        let table = Arc::new(
            self.table(reloader.current())
                .map_err(LimitsLayerError::Config)?,
        );
        let applied = Arc::clone(&table);
        let watcher = LimitsWatcher::start(reloader, interval, move |limits| {
            if let Err(e) = applied.apply(limits) {
                tracing::error!(
                    name = %applied.entries.name,
                    error = %e,
                    "limits file read but not put in force; the limits in force are kept"
                );
            }
        });
        Ok(LimitsLayer {
            shared: Arc::new(LimitsState {
                table,
                watcher: Some(watcher),
            }),
        })
    }

    fn table(self, limits: &Limits) -> Result<LimitsTable, ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::out_of_range(
                "interval",
                self.interval,
                "above zero",
            ));
        }
        let entries = LimitsEntrySettings {
            name: LayerName::new(self.name)?,
            client_ip: self.client_ip,
            admitted_headers: self.admitted_headers,
            clock: TokioClock::new(),
        };
        LimitsTable::new(entries, limits)
    }
}

/// Why a [`LimitsLayer`] could not be built from a file.
#[derive(Debug)]
pub enum LimitsLayerError {
    /// The file was refused: where (`path:line:column`) and why.
    File(LimitsFileError),
    /// A setting of the builder is invalid.
    Config(ConfigError),
}

impl fmt::Display for LimitsLayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(e) => e.fmt(f),
            Self::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LimitsLayerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::File(e) => Some(e),
            Self::Config(e) => Some(e),
        }
    }
}
