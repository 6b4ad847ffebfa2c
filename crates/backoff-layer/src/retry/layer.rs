use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{SystemWallClock, TokioClock, WallClock};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics};
use tower_layer::Layer;

use super::config::RetryConfig;
use super::destinations::DestinationSeries;
use super::service::Retry;
use super::stop::StopSignals;
use super::telemetry::STOP_SIGNAL_QUIET;
use crate::adapter::Direct;
use crate::backoff::{Backoff, Exponential, Seeds};
use crate::budget::{Budget, RetryBudget};
use crate::classify::{Classify, DefaultClassifier, GrpcCodes};
use crate::throttle::Throttle;

/// What the layer's own throttle's seed source is derived with (any constant: "throttle").
const THROTTLE_SEEDS_SALT: u64 = 0x7468_726f_7474_6c65;

/// Applies [`Retry`] to a service. Cheap to clone: the configuration is shared.
///
/// [`RetryLayer::new`] (or `default()`) uses every default; [`RetryLayer::builder`] changes
/// them. The defaults, with their sources, are listed on [`RetryBuilder`]; the numeric ones
/// are also associated constants of this type.
///
/// ```
/// use std::time::Duration;
/// use backoff_layer::RetryLayer;
/// use backoff_layer::backoff::FullJitter;
///
/// // Every default: 3 attempts, the article's backoff, the default retry budget, a 15 s
/// // deadline, a client-side throttle per destination.
/// let layer = RetryLayer::new();
///
/// // Customised: named after its downstream, 5 attempts, full jitter, a 2 s timeout per
/// // attempt.
/// let layer = RetryLayer::builder()
///     .name("payments")
///     .max_attempts(5)
///     .backoff(FullJitter::new())
///     .attempt_timeout(Duration::from_secs(2))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
///
/// The type parameter is the [`Adapter`](crate::adapter::Adapter): how the layer fits the
/// service it wraps. [`Direct`] by default; `RetryLayer::for_tonic` (with the `tonic`
/// feature) makes a layer for a tonic `Channel`.
pub struct RetryLayer<A = Direct> {
    config: Arc<RetryConfig>,
    // NOTE: `fn() -> A` keeps the layer `Send + Sync + Clone` whatever `A` is.
    adapter: PhantomData<fn() -> A>,
}

impl<A> Clone for RetryLayer<A> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
            adapter: PhantomData,
        }
    }
}

impl<A> fmt::Debug for RetryLayer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("config", &self.config)
            .field("adapter", &std::any::type_name::<A>())
            .finish()
    }
}

impl RetryLayer {
    /// Default max attempts, the first included: 3 (SRE book, AWS SDKs, Polly).
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

    /// Default body replay limit: 64 KiB (linkerd).
    pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

    /// Default overall deadline per request: 15 seconds, Envoy's default route timeout (the
    /// time Envoy waits for an upstream's response, retries included).
    ///
    /// Without it, a downstream that accepts a request and never answers would hold the
    /// request, its buffered body and its caller forever. What it bounds, and what it does
    /// not:
    ///
    /// - it bounds the time until the final response's **head**: attempts, backoff waits and
    ///   waits for the inner service's readiness. A response whose head came in time is
    ///   returned, and its **body streams for as long as it lasts**: the layer never cuts a
    ///   body, by this deadline or any other;
    /// - it is **never sent to a gRPC server**: a gRPC request under the default deadline
    ///   carries no `grpc-timeout` (only one set with [`RetryBuilder::deadline`], or the
    ///   caller's, is sent, as the time left), since a server would otherwise end a long
    ///   server-streaming call at 15 s. An HTTP attempt carries it in `X-Request-Deadline`,
    ///   which promises a wait for the response's head only (see the crate docs' [Deadlines
    ///   on the wire](crate#deadlines-on-the-wire));
    /// - a caller's own deadline, when earlier, takes its place.
    ///
    /// [`RetryBuilder::deadline`] sets another (which gRPC requests then carry);
    /// [`RetryBuilder::no_deadline`] removes it.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(15);

    /// Default timeout per attempt: none, as in hyper-util's client. A stack that needs one
    /// sets it here or puts a timeout layer under the retry layer.
    pub const DEFAULT_ATTEMPT_TIMEOUT: Option<Duration> = None;

    /// Default longest wait a server may ask for (`Retry-After`, `grpc-retry-pushback-ms`)
    /// before the layer gives up instead: 30 seconds.
    ///
    /// Envoy discards a rate-limit reset header longer than its `max_interval` (300 s by
    /// default) and, in any case, never waits past the route's timeout (15 s by default);
    /// gRPC honours any pushback but never past the call's deadline. This layer does the
    /// same: a hint up to this cap is still given up on at once (with
    /// [`GiveUpReason::Deadline`](crate::GiveUpReason::Deadline)) when the wait would end
    /// after the deadline, 15 s by default. The cap is what bounds a wait when the deadline
    /// is off ([`RetryBuilder::no_deadline`]): tens of seconds, as the workspace's design
    /// asks, twice Envoy's default route timeout, and well above the waits this workspace's
    /// rate limiter asks for (`Retry-After` of a second or a few).
    pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

    /// How long a layer must go without receiving the stop signal before it logs that its
    /// downstream no longer says stop retrying: 10 seconds, the window over which
    /// `overload-signal` decides to send the signal (its attempt histogram's default), and
    /// the retry budget's default window. Not a setting: see the crate docs' Logs section.
    pub const STOP_SIGNAL_QUIET: Duration = STOP_SIGNAL_QUIET;

    /// Default number of destinations with `backoff_layer_request_outcomes_total` and
    /// `backoff_layer_attempt_outcomes_total` series of their own: 32, the first 32 the
    /// layer sends to; the rest share `server_address="(other)"`. The same as the
    /// throttle's gauges ([`Throttle::DEFAULT_MAX_LABELLED_DESTINATIONS`]).
    pub const DEFAULT_MAX_DESTINATION_SERIES: usize = 32;

    /// The largest [`RetryBuilder::max_destination_series`] accepted: 1 024.
    pub const MAX_DESTINATION_SERIES: usize = 1_024;

    /// A layer with every default; see [`RetryBuilder`] for what they are.
    pub fn new() -> Self {
        Self::builder().finish(LayerName::default())
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> RetryBuilder {
        RetryBuilder {
            name: None,
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            deadline: Some(Self::DEFAULT_DEADLINE),
            deadline_on_wire: false,
            attempt_timeout: Self::DEFAULT_ATTEMPT_TIMEOUT,
            max_retry_after: Self::DEFAULT_MAX_RETRY_AFTER,
            backoff: None,
            budget: None,
            classifier: None,
            grpc_retryable_codes: None,
            body_limit: Self::DEFAULT_BODY_LIMIT,
            max_destination_series: Self::DEFAULT_MAX_DESTINATION_SERIES,
            seeds: None,
            stop_signals: StopSignals::PassUp,
            throttle: ThrottleChoice::Default,
            wall: None,
            contradictions: Contradictions::NONE,
        }
    }

    /// The same layer for a tonic `Channel` (or any `Service<http::Request<tonic::body::Body>>`):
    /// a generated client takes the retrying service as it is, and failures reach it as
    /// tonic `Status`es; see [`Tonic`](crate::adapter::Tonic). With the `tonic` feature.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use backoff_layer::RetryLayer;
    /// use backoff_layer::adapter::Tonic;
    /// use tonic::transport::Channel;
    /// use tonic_health::pb::HealthCheckRequest;
    /// use tonic_health::pb::health_client::HealthClient;
    /// use tower::ServiceBuilder;
    ///
    /// // The retrying client's type can be named, to keep it in a struct.
    /// type Client = HealthClient<backoff_layer::Retry<Channel, Tonic>>;
    ///
    /// let channel = Channel::from_static("http://127.0.0.1:50051").connect().await?;
    /// let mut client: Client = HealthClient::new(
    ///     ServiceBuilder::new()
    ///         .layer(RetryLayer::new().for_tonic())
    ///         .service(channel),
    /// );
    /// match client.check(HealthCheckRequest::default()).await {
    ///     Ok(response) => { /* RetryInfo in response.extensions() */ }
    ///     Err(status) if backoff_layer::is_overloaded(&status) => {
    ///         // Code::Unavailable, with `x-overloaded` in its metadata: do not retry
    ///     }
    ///     Err(status) => { /* Tonic::attempts(&status) attempts were made */ }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tonic")]
    pub fn for_tonic(self) -> RetryLayer<crate::adapter::Tonic> {
        RetryLayer {
            config: self.config,
            adapter: PhantomData,
        }
    }
}

impl Default for RetryLayer {
    /// The same as [`RetryLayer::new`]: every default.
    fn default() -> Self {
        Self::new()
    }
}

impl<S, A> Layer<S> for RetryLayer<A> {
    type Service = Retry<S, A>;

    fn layer(&self, inner: S) -> Retry<S, A> {
        Retry::new(inner, Arc::clone(&self.config))
    }
}

/// Configures a [`RetryLayer`]; made by [`RetryLayer::builder`]. Every setting has a
/// default:
///
/// | setting | default | source |
/// |---|---|---|
/// | [`name`](Self::name) | `"default"` | |
/// | [`max_attempts`](Self::max_attempts) | 3 (the first attempt included) | SRE book, AWS SDKs, Polly |
/// | [`deadline`](Self::deadline) | 15 s, until the final response's head (or the caller's deadline, if earlier); sent in `X-Request-Deadline`, never as `grpc-timeout`; [`no_deadline`](Self::no_deadline) removes it | Envoy's default route timeout |
/// | [`attempt_timeout`](Self::attempt_timeout) | none | hyper-util's client |
/// | [`max_retry_after`](Self::max_retry_after) | 30 s | Envoy's rate-limited retry back-off, bounded by its 15 s route timeout; gRPC's deadline |
/// | [`backoff`](Self::backoff) | [`Exponential::new()`]: 100 ms, x2, jitter 0.1, at most 15 min | the article |
/// | [`budget`](Self::budget) | a [`RetryBudget`] with its defaults, named after the layer: retries at most 10% of first attempts over 10 s, plus 1 retry per second | paper, SRE book |
/// | [`classifier`](Self::classifier) | [`DefaultClassifier`]: connect errors, timeouts, 429, 502, 503, 504; idempotent methods, `Idempotency-Key` or gRPC | RFC 9110, Envoy, .NET, gRPC |
/// | [`grpc_retryable_codes`](Self::grpc_retryable_codes) | `RESOURCE_EXHAUSTED` (8), `UNAVAILABLE` (14) | gRPC's retry design (A6) |
/// | [`body_limit`](Self::body_limit) | 64 KiB | linkerd |
/// | [`max_destination_series`](Self::max_destination_series) | 32 destinations with outcome series of their own, the rest in `(other)` | the throttle's gauges |
/// | [`seeds`](Self::seeds) | [`Seeds::from_os()`] | |
/// | [`throttle`](Self::throttle) | a [`Throttle`] with its defaults, named after the layer: per destination, 2 s window, K = 2, at most 90 % refused; [`no_throttle`](Self::no_throttle) turns it off | the SRE book, Envoy, gRPC-Go; see [`throttle`](crate::throttle) |
/// | [`stop_signals`](Self::stop_signals) | [`StopSignals::PassUp`]: a downstream's stop signal is honoured and passed up to the server's callers | this workspace's protocol, inside one organisation |
/// | [`wall_clock`](Self::wall_clock) | [`SystemWallClock`] | |
///
/// [`build`](Self::build) checks the settings:
///
/// - `name` is non-empty printable ASCII, at most 128 bytes;
/// - `max_attempts` is at least 1 (1 turns retries off);
/// - `deadline`, if set, is greater than zero;
/// - `attempt_timeout`, if set, is greater than zero;
/// - `max_destination_series` is within 0..=1 024;
/// - every code in `grpc_retryable_codes` is a gRPC status other than `OK` (1..=16), and
///   `grpc_retryable_codes` is not set together with a `classifier` of your own;
/// - a setting is not both given and turned off (`deadline` with `no_deadline`, `throttle`
///   with `no_throttle`): the last call does not silently win.
#[must_use = "a builder does nothing until `build` is called"]
pub struct RetryBuilder {
    name: Option<String>,
    max_attempts: u32,
    deadline: Option<Duration>,
    /// Whether `deadline` was set with [`RetryBuilder::deadline`] (and is sent as
    /// `grpc-timeout`).
    deadline_on_wire: bool,
    attempt_timeout: Option<Duration>,
    max_retry_after: Duration,
    backoff: Option<Arc<dyn Backoff>>,
    budget: Option<Arc<dyn Budget>>,
    classifier: Option<Arc<dyn Classify>>,
    grpc_retryable_codes: Option<GrpcCodes>,
    body_limit: usize,
    max_destination_series: usize,
    seeds: Option<Arc<Seeds>>,
    wall: Option<Arc<dyn WallClock>>,
    stop_signals: StopSignals,
    throttle: ThrottleChoice,
    /// Settings both set and turned off: `build` refuses them.
    contradictions: Contradictions,
}

/// Which settings were both given and turned off on one builder (`deadline` and
/// `no_deadline`, `throttle` and `no_throttle`): `build` refuses that rather than let the
/// last call win silently.
#[derive(Clone, Copy, Debug, Default)]
struct Contradictions {
    deadline_set: bool,
    deadline_off: bool,
    throttle_given: bool,
    throttle_off: bool,
}

impl Contradictions {
    const NONE: Self = Self {
        deadline_set: false,
        deadline_off: false,
        throttle_given: false,
        throttle_off: false,
    };

    fn check(self) -> Result<(), ConfigError> {
        if self.deadline_set && self.deadline_off {
            return Err(ConfigError::conflict(
                "deadline",
                "deadline and no_deadline were both called: keep one",
            ));
        }
        if self.throttle_given && self.throttle_off {
            return Err(ConfigError::conflict(
                "throttle",
                "throttle and no_throttle were both called: keep one",
            ));
        }
        Ok(())
    }
}

/// The throttle a builder gives its layer.
#[derive(Debug)]
enum ThrottleChoice {
    /// A throttle of the layer's own, with the defaults, named after it.
    Default,
    /// This one (shared with its other clones).
    Given(Throttle),
    /// None.
    Off,
}

impl fmt::Debug for RetryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NOTE: `Budget` is not `Debug`; it is left out.
        f.debug_struct("RetryBuilder")
            .field("name", &self.name)
            .field("max_attempts", &self.max_attempts)
            .field("deadline", &self.deadline)
            .field("deadline_on_wire", &self.deadline_on_wire)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("max_retry_after", &self.max_retry_after)
            .field("backoff", &self.backoff)
            .field("classifier", &self.classifier)
            .field("grpc_retryable_codes", &self.grpc_retryable_codes)
            .field("body_limit", &self.body_limit)
            .field("max_destination_series", &self.max_destination_series)
            .field("stop_signals", &self.stop_signals)
            .field("throttle", &self.throttle)
            .finish_non_exhaustive()
    }
}

impl RetryBuilder {
    /// What the layer calls itself: the label `name` of every metric it records
    /// (`backoff_layer_requests_total{name="payments"}`, ...) and the field `name` of every
    /// state change it logs; also the name of the retry budget the layer makes when it is
    /// given none (a budget you pass in keeps its own, see
    /// [`RetryBudgetBuilder::name`](crate::budget::RetryBudgetBuilder::name)). Name each
    /// layer after its downstream when a process has more than one, so an operator can tell
    /// them apart. Non-empty printable ASCII, at most 128 bytes. Default: `"default"`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The most attempts per request, the first included: `1` turns retries off. Must be at
    /// least 1. Default: 3 (SRE book, AWS SDKs, Polly).
    pub const fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// An overall deadline per request, from the call to the retry layer until the final
    /// response's head. It holds in every state: no attempt is sent after it (a wait for the
    /// inner service to be ready included), a wait that would end after it is not started
    /// (the layer gives up at once), an attempt still running at the deadline is cut short,
    /// and a failure that comes back after it ends the request; the outcome is
    /// [`GiveUpReason::Deadline`](crate::GiveUpReason::Deadline). A response body is never
    /// cut: once the head is returned, the body streams for as long as it lasts.
    ///
    /// A caller's own deadline, when earlier, takes its place for that request (see the
    /// crate docs' [Deadlines on the wire](crate#deadlines-on-the-wire)).
    ///
    /// gRPC requests carry what is left of a deadline set here in `grpc-timeout` (the
    /// server then ends the call, streaming or not, when it passes); HTTP requests carry it
    /// in `X-Request-Deadline`. Must be greater than zero. Default: 15 s
    /// ([`RetryLayer::DEFAULT_DEADLINE`], Envoy's default route timeout), which HTTP
    /// requests carry and gRPC requests never do.
    pub const fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self.deadline_on_wire = true;
        self.contradictions.deadline_set = true;
        self
    }

    /// No overall deadline of the layer's own: a request lasts as long as its attempts, its
    /// backoff waits and the inner service take, unless its caller gave it a deadline (which
    /// the layer still honours and sends). For a caller with a deadline of its own above the
    /// layer, or a stack with a per-attempt timeout that bounds every attempt. Without a
    /// deadline nor a timeout, an attempt to a downstream that never answers never ends.
    ///
    /// Not with [`deadline`](Self::deadline): [`build`](Self::build) refuses both.
    pub const fn no_deadline(mut self) -> Self {
        self.deadline = None;
        self.deadline_on_wire = false;
        self.contradictions.deadline_off = true;
        self
    }

    /// A timeout for each attempt. An attempt that runs out of time is dropped and its
    /// outcome is [`AttemptTimedOut`](crate::AttemptTimedOut), retryable by the default
    /// classifier. Each attempt carries it (`X-Request-Deadline`, or `grpc-timeout` for
    /// gRPC) when it is shorter than what is left of the deadline: a server need not work
    /// on an attempt longer than the client waits for it. Must be greater than zero.
    /// Default: none, as in hyper-util's client.
    pub const fn attempt_timeout(mut self, attempt_timeout: Duration) -> Self {
        self.attempt_timeout = Some(attempt_timeout);
        self
    }

    /// The longest wait a server may ask for before the next attempt (`Retry-After` in
    /// seconds or as a date, or `grpc-retry-pushback-ms`). A hint up to it is a lower bound
    /// on the wait, even above the backoff strategy's maximum delay; a longer one
    /// makes the layer give up at once, with
    /// [`GiveUpReason::RetryAfterTooLong`](crate::GiveUpReason::RetryAfterTooLong), rather
    /// than park the request, its buffered body and a budget token. `Duration::ZERO` gives
    /// up on any hint but zero. Default: 30 s
    /// ([`RetryLayer::DEFAULT_MAX_RETRY_AFTER`] says why).
    pub const fn max_retry_after(mut self, max_retry_after: Duration) -> Self {
        self.max_retry_after = max_retry_after;
        self
    }

    /// The backoff strategy. Default: the article's, [`Exponential::new()`] (100 ms, x2,
    /// jitter 0.1, at most 15 min).
    pub fn backoff(mut self, backoff: impl Backoff) -> Self {
        self.backoff = Some(Arc::new(backoff));
        self
    }

    /// A backoff strategy shared with other layers (or chosen at run time, as a trait
    /// object).
    pub fn shared_backoff(mut self, backoff: Arc<dyn Backoff>) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// The retry budget; every layer built from this builder shares it. It keeps its own
    /// name ([`RetryBudgetBuilder::name`](crate::budget::RetryBudgetBuilder::name)).
    /// Default: a [`RetryBudget`] with its defaults (10% of first attempts over 10 s, plus 1
    /// retry per second, from the paper and the SRE book), named after the layer;
    /// [`Unlimited`](crate::budget::Unlimited) turns it off.
    pub fn budget(mut self, budget: impl Budget) -> Self {
        self.budget = Some(Arc::new(budget));
        self
    }

    /// A retry budget shared with other layers (for example one budget per downstream
    /// service, shared by every client of it). It keeps its own name, whichever layers share
    /// it: name it after the downstream.
    pub fn shared_budget(mut self, budget: Arc<dyn Budget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// What is retried. Default: [`DefaultClassifier::new()`] (RFC 9110, Envoy, .NET, gRPC).
    pub fn classifier(mut self, classifier: impl Classify) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// The gRPC status codes worth another attempt, replacing the default classifier's
    /// (the same as `.classifier(DefaultClassifier::builder().grpc_retryable_codes(codes)
    /// .build()?)`). An empty list retries no gRPC status. Each must be within 1..=16; not
    /// with a [`classifier`](Self::classifier) of your own. Default: `RESOURCE_EXHAUSTED` (8)
    /// and `UNAVAILABLE` (14), from gRPC's retry design (A6) and the protocol's node-local
    /// rejection.
    pub const fn grpc_retryable_codes(mut self, codes: &[u16]) -> Self {
        self.grpc_retryable_codes = Some(GrpcCodes::from_codes(codes));
        self
    }

    /// The largest request body kept for replay, in bytes; larger bodies are streamed once
    /// and never retried. `0` keeps only empty bodies replayable. Default: 64 KiB (linkerd).
    pub const fn body_limit(mut self, body_limit: usize) -> Self {
        self.body_limit = body_limit;
        self
    }

    /// How many destinations get outcome series of their own
    /// (`backoff_layer_request_outcomes_total` and `backoff_layer_attempt_outcomes_total`,
    /// label `server_address`): the first ones the layer sends to, kept for the layer's
    /// life; every later one is counted in `server_address="(other)"`. So a layer records at
    /// most `4 * (max_destination_series + 1)` of these series whatever URLs it is given
    /// (a webhook sender, a forward proxy). `0` counts every destination in `(other)`.
    /// Within 0..=1 024. Default: 32 ([`RetryLayer::DEFAULT_MAX_DESTINATION_SERIES`]), as
    /// the throttle's gauges.
    pub const fn max_destination_series(mut self, max_destination_series: usize) -> Self {
        self.max_destination_series = max_destination_series;
        self
    }

    /// Where each request's random generator gets its seed. Default: [`Seeds::from_os()`],
    /// keyed by the operating system's generator; tests pass [`Seeds::from_seed`] to make
    /// delays reproducible.
    pub fn seeds(mut self, seeds: Seeds) -> Self {
        self.seeds = Some(Arc::new(seeds));
        self
    }

    /// Where the layer reads the time of day for the send time of `X-Request-Deadline`.
    /// Default: the operating system's
    /// ([`SystemWallClock`](crate::clock::SystemWallClock)); a simulation under tokio's
    /// paused time passes a [`TokioWallClock`](crate::clock::TokioWallClock), so that the
    /// servers it runs read the same clock.
    pub fn wall_clock(mut self, wall: impl WallClock) -> Self {
        self.wall = Some(Arc::new(wall));
        self
    }

    /// Whose stop signals the layer passes up to the server it runs in: all, honoured and
    /// passed up ([`StopSignals::PassUp`], the default: right for downstreams of the same
    /// organisation), or none, honoured only ([`StopSignals::HonourOnly`]: for a third
    /// party, whose `X-Overloaded` must not make our server tell its own callers to stop).
    /// Either way a failure carrying the stop signal is never retried. [`StopSignals`] has
    /// the whole table.
    pub const fn stop_signals(mut self, stop_signals: StopSignals) -> Self {
        self.stop_signals = stop_signals;
        self
    }

    /// The client-side throttle: when a destination keeps failing, most of its requests fail
    /// at once with [`Throttled`](crate::Throttled), without being sent, and the rest probe
    /// it. A throttle is shared by its clones: give clones of one to several layers and it
    /// sees their whole load. Default: a [`Throttle`] with its defaults, named after the
    /// layer (per destination, a 2 s window, K = 2, at most 90 % refused; the
    /// [`throttle`](crate::throttle) module says why and how).
    pub fn throttle(mut self, throttle: Throttle) -> Self {
        self.throttle = ThrottleChoice::Given(throttle);
        self.contradictions.throttle_given = true;
        self
    }

    /// No client-side throttle: every request is sent, however its destination has been
    /// failing (retries are still bounded by the budget). Not with
    /// [`throttle`](Self::throttle): [`build`](Self::build) refuses both.
    pub fn no_throttle(mut self) -> Self {
        self.throttle = ThrottleChoice::Off;
        self.contradictions.throttle_off = true;
        self
    }

    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that breaks one of the rules listed on
    /// [`RetryBuilder`].
    pub fn build(mut self) -> Result<RetryLayer, ConfigError> {
        let name = match self.name.take() {
            Some(name) => LayerName::new(name)?,
            None => LayerName::default(),
        };
        self.contradictions.check()?;
        if self.max_attempts == 0 {
            return Err(ConfigError::out_of_range(
                "max_attempts",
                self.max_attempts,
                "at least 1",
            ));
        }
        for (field, value) in [
            ("deadline", self.deadline),
            ("attempt_timeout", self.attempt_timeout),
        ] {
            if let Some(zero) = value.filter(Duration::is_zero) {
                return Err(ConfigError::out_of_range(field, zero, "greater than zero"));
            }
        }
        if self.max_destination_series > RetryLayer::MAX_DESTINATION_SERIES {
            return Err(ConfigError::out_of_range(
                "max_destination_series",
                self.max_destination_series,
                "within 0..=1024",
            ));
        }
        if let Some(codes) = self.grpc_retryable_codes {
            codes.check()?;
            if let Some(classifier) = &self.classifier {
                return Err(ConfigError::conflict(
                    "grpc_retryable_codes",
                    format_args!(
                        "grpc_retryable_codes ({codes:?}) configures the default classifier \
                         and cannot be used with classifier ({classifier:?}); give that \
                         classifier its codes instead"
                    ),
                ));
            }
            self.classifier = Some(Arc::new(DefaultClassifier::from_grpc_codes(codes)));
        }
        Ok(self.finish(name))
    }

    /// The layer named `name`, without checks: for [`build`](Self::build) and for the
    /// defaults.
    fn finish(self, name: LayerName) -> RetryLayer {
        // NOTE: the layer's own budget is named after it; nothing is registered with a
        // metrics recorder here, neither by the layer nor by its budget.
        let budget = self
            .budget
            .unwrap_or_else(|| Arc::new(RetryBudget::named(name.clone())));
        let seeds = self.seeds.unwrap_or_else(|| Arc::new(Seeds::from_os()));
        // NOTE: the layer's own throttle is named after it too, and draws from a source
        // derived from the layer's (a seeded layer refuses the same requests every run,
        // without shifting its requests' jitter); its table is made on the first request.
        let throttle = match self.throttle {
            ThrottleChoice::Default => Some(Throttle::named(
                name.clone(),
                seeds.derive(THROTTLE_SEEDS_SALT),
            )),
            ThrottleChoice::Given(throttle) => Some(throttle),
            ThrottleChoice::Off => None,
        };
        RetryLayer {
            config: Arc::new(RetryConfig {
                max_attempts: self.max_attempts,
                deadline: self.deadline,
                deadline_on_wire: self.deadline_on_wire && self.deadline.is_some(),
                wall: self.wall.unwrap_or_else(|| Arc::new(SystemWallClock)),
                attempt_timeout: self.attempt_timeout,
                max_retry_after: self.max_retry_after,
                backoff: self.backoff.unwrap_or_else(|| Arc::new(Exponential::new())),
                budget,
                classifier: self
                    .classifier
                    .unwrap_or_else(|| Arc::new(DefaultClassifier::new())),
                body_limit: self.body_limit,
                seeds,
                stop_signal_policy: self.stop_signals,
                throttle,
                destinations: DestinationSeries::new(name.clone(), self.max_destination_series),
                metrics: LazyMetrics::new(name),
                stop_signals: Episode::new(),
                clock: TokioClock::new(),
            }),
            adapter: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests;
