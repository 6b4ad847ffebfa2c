//! What every service made by one layer shares, and the decision on each response.
//!
//! Its own module so that the service (which records) and the response future (which
//! decides) both depend on it and not on each other.

use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{Extensions, HeaderMap, Response};
use overload_core::clock::{Clock, TokioClock};
use overload_core::sync::{AtomicU64, Ordering};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, LogThrottle, Ticker};

use super::callers::{Caller, CallerKey, CallerLedger, KeyHashing, UNKEYED};
use super::peer::{PeerIp, client_addr};
use super::rejection::{Rejection, RejectionKind, RejectionScope};
use super::rule::StopRule;
use super::telemetry::{
    ErrorAnswer, SignalMetrics, StopTrigger, log_disengaged, log_engaged, log_unkeyed,
};
use crate::histogram::{AttemptClass, AttemptHistogram};
use crate::propagation::{Downstream, Marks};
use crate::protocol::{self, Criticality, Outcome, Protocol, RequestFields};
use crate::reserves::RecentLevels;

/// The wait a proxy's answer asks for when its retry layer's throttle refused the call.
const THROTTLED_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// What every service made by one layer shares: the histogram, the rule, the caller
/// ledger, and what the layer reports.
pub(crate) struct SignalState<C: Clock = TokioClock> {
    pub(crate) histogram: AttemptHistogram<C>,
    /// The rule in force: replaced whole by `OverloadSignalLayer::set_rule`, loaded once per
    /// judged rejection so that one decision sees one rule.
    pub(crate) rule: ArcSwap<StopRule>,
    pub(super) callers: CallerLedger<C>,
    /// Whether rejections without a [`Rejection`] marker are judged too.
    pub(super) judge_every: bool,
    /// Requests without a caller key: logged again at most once per interval.
    unkeyed: LogThrottle,
    /// One past the bucket whose window was last exported as gauges (0: never).
    exported: AtomicU64,
    /// The metric handles, registered on the first request.
    metrics: LazyMetrics<SignalMetrics>,
    /// The layer answering rejections with the stop signal because its rule fired.
    stopping: Episode,
    /// The ticker that keeps the gauges true and ends the episode, started by the first
    /// request.
    ticker: Ticker,
    /// The levels whose server-scoped rejections were passed plainly (not as the stop
    /// signal) within the histogram's window.
    passed_levels: RecentLevels,
}

/// How a layer is put together: what its builder sets.
pub(crate) struct SignalSettings<C: Clock = TokioClock> {
    pub(crate) name: LayerName,
    pub(crate) histogram: AttemptHistogram<C>,
    pub(crate) rule: StopRule,
    /// The caller key: `None` for the default, [`PeerIp`].
    pub(crate) key: Option<Arc<dyn CallerKey>>,
    pub(crate) hashing: KeyHashing,
    pub(crate) judge_every: bool,
}

/// How often a layer that keeps receiving requests without a caller key logs it again: at
/// most once a minute, each line with the count since the previous one.
pub(crate) const UNKEYED_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

impl SignalSettings {
    /// The defaults: named `"default"`, the default histogram and rule, callers keyed by
    /// their network, hashed with a random key.
    pub(crate) fn new() -> Self {
        Self {
            name: LayerName::default(),
            histogram: AttemptHistogram::new(),
            rule: StopRule::new(),
            key: None,
            hashing: KeyHashing::random(),
            judge_every: false,
        }
    }
}

impl<C: Clock> SignalSettings<C> {
    /// These settings with another histogram (and its clock).
    pub(crate) fn with_histogram<C2: Clock>(
        self,
        histogram: AttemptHistogram<C2>,
    ) -> SignalSettings<C2> {
        SignalSettings {
            name: self.name,
            histogram,
            rule: self.rule,
            key: self.key,
            hashing: self.hashing,
            judge_every: self.judge_every,
        }
    }
}

impl<C: Clock> SignalState<C> {
    pub(super) fn new(settings: SignalSettings<C>) -> Self {
        let SignalSettings {
            name,
            histogram,
            rule,
            key,
            hashing,
            judge_every,
        } = settings;
        let window = histogram.window();
        Self {
            callers: CallerLedger::new(&histogram, key, hashing),
            judge_every,
            unkeyed: LogThrottle::new(UNKEYED_LOG_INTERVAL),
            histogram,
            rule: ArcSwap::from_pointee(rule),
            exported: AtomicU64::new(0),
            metrics: LazyMetrics::new(name),
            stopping: Episode::new(),
            ticker: Ticker::new(),
            passed_levels: RecentLevels::new(window),
        }
    }

    /// The layer's name: the `name` label of its metrics and the `name` field of its logs.
    pub(crate) fn name(&self) -> &LayerName {
        self.metrics.name()
    }

    /// How long the layer must not have answered with the stop signal before its episode
    /// is logged as over: one window of the histogram, the span over which the rule judges.
    fn quiet_period(&self) -> std::time::Duration {
        self.histogram.window()
    }

    /// Records a request: its attempt counter (if its caller is `trusted`) in the
    /// histogram, and in its caller class. On the layer's first request, registers the
    /// metrics and starts the ticker.
    #[inline]
    pub(crate) fn record(
        self: &Arc<Self>,
        parts: &Parts,
        protocol: Protocol,
        trusted: impl FnOnce() -> bool,
    ) -> Caller {
        self.record_fields(parts, protocol, RequestFields::ALL, trusted)
    }

    /// [`record`](Self::record) for a request that may carry `fields`, and no other
    /// counter.
    #[inline]
    pub(crate) fn record_fields(
        self: &Arc<Self>,
        parts: &Parts,
        protocol: Protocol,
        fields: RequestFields,
        trusted: impl FnOnce() -> bool,
    ) -> Caller {
        self.record_head(
            &parts.headers,
            &parts.extensions,
            Some(parts),
            protocol,
            fields,
            trusted,
        )
    }

    /// Whether [`record_head`](Self::record_head) needs the request's [`Parts`]: only for a
    /// caller key of the user's own (the default reads the extensions).
    #[inline]
    pub(crate) const fn key_reads_parts(&self) -> bool {
        self.callers.key_reads_parts()
    }

    /// [`record_fields`](Self::record_fields) from the request's headers and extensions, and
    /// its `parts` when the caller took it apart, which it must when
    /// [`key_reads_parts`](Self::key_reads_parts).
    pub(crate) fn record_head(
        self: &Arc<Self>,
        headers: &HeaderMap,
        extensions: &Extensions,
        parts: Option<&Parts>,
        protocol: Protocol,
        fields: RequestFields,
        trusted: impl FnOnce() -> bool,
    ) -> Caller {
        let (attempt, lane) = self.callers.identify_head(
            headers,
            parts,
            protocol.is_grpc(),
            fields,
            trusted,
            // NOTE: the same words `PeerIp::hash_key` writes, into the same hasher, so the
            // same class; without the two calls through `dyn`.
            |state| PeerIp::hash_extensions(extensions, state),
        );
        let class = AttemptClass::of(attempt);
        let bucket = self.histogram.bucket_now();
        self.histogram.record_in(bucket, class);
        let caller = self.callers.record(bucket, lane, class.is_retry());
        self.ticker
            .start(self, self.histogram.bucket_width(), |_| {}, Self::tick);
        if lane == UNKEYED {
            self.report_unkeyed(extensions);
        }
        self.export_window(bucket);
        caller
    }

    /// A request without a caller key: counted, and logged at the first one and then at
    /// most once per [`UNKEYED_LOG_INTERVAL`] while they keep coming, because the server is
    /// then set up so that one caller can forge a storm for every caller without a key: at
    /// `ERROR` with the fix when the request carries no peer address at all.
    #[cold]
    fn report_unkeyed(&self, extensions: &Extensions) {
        self.metrics.get().unkeyed();
        if let Some(count) = self.unkeyed.note(self.histogram.clock().now()) {
            let no_peer = client_addr(extensions).is_none();
            log_unkeyed(self.name(), count, UNKEYED_LOG_INTERVAL, no_peer);
        }
    }

    /// What the ticker does every bucket.
    fn tick(&self) {
        self.export_window(self.histogram.bucket_now());
        let quiet = self.quiet_period();
        if let Some(ended) = self.stopping.quiet_for(quiet, self.histogram.clock().now()) {
            log_disengaged(self.name(), ended, quiet);
        }
    }

    /// Sets the window gauges, once per bucket (by the first request of the bucket, or by
    /// the ticker), with the window that ended with the previous bucket: whole buckets, so
    /// the figure is stable.
    #[inline]
    fn export_window(&self, bucket: u64) {
        let seen = self.exported.load(Ordering::Relaxed);
        if seen <= bucket {
            self.export_window_once(seen, bucket);
        }
    }

    /// [`export_window`](Self::export_window) at the first request of a bucket: out of line,
    /// once a bucket.
    #[cold]
    #[inline(never)]
    fn export_window_once(&self, seen: u64, bucket: u64) {
        if self
            .exported
            .compare_exchange(seen, bucket + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let last = bucket.saturating_sub(1);
            let window = self.histogram.snapshot_of(last);
            let per_caller = self.callers.per_caller_pressure(last);
            self.metrics.get().export_window(&window, per_caller);
        }
    }

    /// The response to send, given the inner stack's and whether a downstream call made
    /// while producing it received the stop signal.
    #[inline]
    pub(super) fn respond<B: Default>(
        &self,
        response: &mut Response<B>,
        protocol: Protocol,
        downstream_stop: bool,
        caller: Caller,
        level: Criticality,
    ) {
        // NOTE: every case below is a failure (rejections and stop signals included: 429,
        // 503 and gRPC 8 and 14 are failures), so successes and deliberate 4xx, the admitted
        // path, leave here after a status check, the response not even moved.
        let outcome = Outcome::of_response(protocol, response.status(), response.headers());
        if outcome.is_failure() {
            self.respond_to_failure(response, protocol, outcome, downstream_stop, caller, level);
        }
    }

    /// [`respond`](Self::respond) for a failure: the stop signal passed on, propagated, or
    /// decided; or the failure untouched. Out of line: the admitted path only checks the
    /// status.
    #[inline(never)]
    fn respond_to_failure<B: Default>(
        &self,
        response: &mut Response<B>,
        protocol: Protocol,
        outcome: Outcome,
        downstream_stop: bool,
        caller: Caller,
        level: Criticality,
    ) {
        if outcome.is_stop_signal() {
            // Already the stop signal: the handler mapped a downstream `Overloaded` itself
            // (or an inner layer sent it, or the handler relayed Envoy's). Pass it on,
            // completed: a form of it that lacks `x-envoy-ratelimited` (a handler's own
            // `X-Overloaded`, Envoy's `x-envoy-overloaded`) would be retried by an Envoy in
            // front of this server.
            protocol::complete_stop_signal(response.headers_mut(), protocol);
            self.metrics.get().propagated(false);
            return;
        }
        if downstream_stop {
            tracing::debug!(
                name = self.name().as_str(),
                decision = "stop_signal_propagated",
                status = %response.status(),
                "downstream call received the stop signal; propagating it"
            );
            let rejection = Rejection::new(RejectionKind::StopRetrying, RejectionScope::Server)
                .with_layer(self.name().clone());
            rewrite_as_stop_signal(response, protocol, rejection);
            self.metrics.get().propagated(true);
            return;
        }
        // NOTE: only what a limiting layer marked as its rejection is judged (unless told
        // to judge every one): a 503 the handler made, or a 429 an upstream sent through a
        // gateway, is not this server's limit speaking, and passes untouched.
        let marked = response.extensions().get::<Rejection>();
        let rejection = match marked {
            Some(rejection) if rejection.is_judged() => rejection.clone(),
            Some(_) => return,
            None if self.judge_every && outcome.is_rejection() => {
                Rejection::new(RejectionKind::RateLimited, RejectionScope::Server)
            }
            None => return,
        };
        let bucket = self.histogram.bucket_now();
        let rule = **self.rule.load();
        let scope = rejection.scope();
        let trigger = match scope {
            RejectionScope::Server => self.server_is_drowning(&rule, bucket, level),
            RejectionScope::Caller => self.caller_is_drowning(&rule, bucket, caller),
        };
        let Some(trigger) = trigger else {
            if scope == RejectionScope::Server {
                self.passed_levels.note(level, self.histogram.clock().now());
            }
            self.metrics.get().rejection_passed(scope, level);
            tracing::debug!(
                name = self.name().as_str(),
                decision = "rejection_passed",
                status = %response.status(),
                scope = scope.as_str(),
                criticality = level.as_str(),
                "rejection passed on: retry pressure under the rule"
            );
            return;
        };
        tracing::debug!(
            name = self.name().as_str(),
            decision = "stop_signal",
            status = %response.status(),
            scope = scope.as_str(),
            criticality = level.as_str(),
            "rejection under high retry pressure; answering with the stop signal"
        );
        rewrite_as_stop_signal(response, protocol, rejection.into_stop_signal(self.name()));
        self.metrics.get().stop_signal(scope, level);
        if self.stopping.seen(self.histogram.clock().now()) {
            log_engaged(self.name(), trigger, &rule);
        }
        if rule.sustain() && !caller.retry {
            // NOTE: the retry this answer holds back keeps the pressure up (see
            // `StopRule::sustain`); a retry is already counted as one.
            self.histogram.record_stopped_in(bucket);
            self.callers.record_stopped(bucket, caller);
        }
    }

    /// The answer for an inner service that returned an error after a downstream call of
    /// the request was marked (`marks` not empty): a proxy's retry layer gave up, was
    /// throttled, or received the stop signal. An error would reset the caller's connection
    /// (the most retryable failure there is); this answers as the protocol says instead:
    ///
    /// | marked | HTTP | gRPC |
    /// |---|---|---|
    /// | the stop signal (a downstream's, or a retry layer's spent budget) | `503`, `X-Overloaded` | `UNAVAILABLE`, pushback `-1` |
    /// | a deadline passed | `504` | `DEADLINE_EXCEEDED` |
    /// | throttled (not sent) | `503`, `Retry-After: 1` | `UNAVAILABLE`, pushback `1000` |
    /// | gave up | `502` | `UNAVAILABLE` |
    #[cold]
    pub(super) fn answer_error<B: Default>(&self, protocol: Protocol, marks: Marks) -> Response<B> {
        let (response, answer) = if marks.stop_signal() {
            let mut response = Response::new(B::default());
            let rejection = Rejection::new(RejectionKind::StopRetrying, RejectionScope::Server)
                .with_layer(self.name().clone());
            rewrite_as_stop_signal(&mut response, protocol, rejection);
            self.metrics.get().propagated(true);
            (response, ErrorAnswer::StopSignal)
        } else if marks.contains(Downstream::DeadlineExceeded) {
            (
                protocol::deadline_exceeded_response(protocol),
                ErrorAnswer::DeadlineExceeded,
            )
        } else if marks.contains(Downstream::Throttled) {
            (
                protocol::service_unavailable_response(protocol, THROTTLED_RETRY_AFTER),
                ErrorAnswer::Throttled,
            )
        } else {
            (
                protocol::bad_gateway_response(protocol),
                ErrorAnswer::GaveUp,
            )
        };
        tracing::debug!(
            name = self.name().as_str(),
            decision = answer.as_str(),
            ?marks,
            status = %response.status(),
            "the inner service returned an error after a downstream call failed; answering"
        );
        self.metrics.get().error_answered(answer);
        response
    }

    /// The rule on the whole server's window: its retry pressure, and the same with each
    /// caller class's weight capped, both above the threshold. What it judged when it fires.
    ///
    /// NOTE: the SRE rule for the stop signal: a server-scoped rejection of `level` is not
    /// turned into the stop signal while a rejection of a lower level was passed plainly
    /// within the window (see the module docs, "Levels").
    fn server_is_drowning(
        &self,
        rule: &StopRule,
        bucket: u64,
        level: Criticality,
    ) -> Option<StopTrigger> {
        if level > Criticality::Sheddable
            && self
                .passed_levels
                .lower_active(level, self.histogram.clock().now())
        {
            return None;
        }
        let window = self.histogram.snapshot_of(bucket);
        // NOTE: the plain rule first: it is cheap, and the per-caller figure is only ever
        // needed when it fires (per-caller accounting can prevent a stop signal, never cause
        // one).
        let fires = rule.should_stop(&window)
            && self.callers.per_caller_fires(rule, bucket, window.total());
        fires.then(|| StopTrigger {
            scope: RejectionScope::Server,
            requests: window.total(),
            retry_share: rule.judged_share(&window).unwrap_or(0.0),
        })
    }

    /// The rule on the rejected caller's own class. What it judged when it fires.
    fn caller_is_drowning(
        &self,
        rule: &StopRule,
        bucket: u64,
        caller: Caller,
    ) -> Option<StopTrigger> {
        let (requests, pressure) = self.callers.class_pressure(bucket, caller);
        rule.fires(requests, pressure).then(|| StopTrigger {
            scope: RejectionScope::Caller,
            requests,
            retry_share: pressure.unwrap_or(0.0),
        })
    }
}

/// Rewrites `response` as the stop signal, marked with `rejection` (of kind
/// [`StopRetrying`](RejectionKind::StopRetrying)) for whatever shapes answers outside.
fn rewrite_as_stop_signal<B: Default>(
    response: &mut Response<B>,
    protocol: Protocol,
    rejection: Rejection,
) {
    protocol::set_stop_signal(response, protocol);
    response.extensions_mut().insert(rejection);
    if protocol.is_grpc() {
        // A gRPC stop signal is trailers-only: any message body must go.
        *response.body_mut() = B::default();
        response.headers_mut().remove(CONTENT_LENGTH);
    }
}
