//! [`DeadlineState`]: what a deadline layer's services share, and how a request's deadline
//! is read when it arrives.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, HeaderMap};
use overload_core::clock::{Clock, SystemWallClock, TokioClock, WallClock};
use overload_core::sync::{AtomicU64, Ordering};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics};
use tokio::time::Instant;

use super::current::current;
use super::telemetry::{DeadlineMetrics, expiring_began, expiring_ended, skew_began, skew_ended};
use super::value::RequestDeadline;
use crate::protocol::{
    GRPC_TIMEOUT, Protocol, RequestFields, WireDeadline, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
    X_REQUEST_DEADLINE, envoy_expected_rq_timeout, grpc_timeout,
};
use crate::signal::trust::Trust;
use crate::signal::{PeerIp, client_addr};

/// How long without an expired request (or a skewed one) before the layer logs that the
/// episode ended: 10 seconds, as the overload layer's stop-signal episodes.
pub(crate) const QUIET: Duration = Duration::from_secs(10);

/// The default skew allowance; `DeadlineLayer::DEFAULT_SKEW_ALLOWANCE` says why.
pub(crate) const DEFAULT_SKEW_ALLOWANCE: Duration = Duration::from_millis(250);

/// The longest a request is believed to have queued: one hour; `DeadlineLayer::MAX_QUEUED`
/// says why.
pub(crate) const MAX_QUEUED: Duration = Duration::from_secs(3600);

/// How many classes the callers of expired and skewed requests are hashed into, to count
/// how many callers each figure comes from; requests without a client address make one more.
const CALLER_CLASSES: u8 = 128;

/// The layer's settings, as the builder collects them.
pub(crate) struct DeadlineSettings {
    pub(crate) name: LayerName,
    pub(crate) skew_allowance: Duration,
    pub(crate) cancel_at_deadline: bool,
    pub(crate) wall: Arc<dyn WallClock>,
}

impl DeadlineSettings {
    pub(crate) fn new() -> Self {
        Self {
            name: LayerName::default(),
            skew_allowance: DEFAULT_SKEW_ALLOWANCE,
            cancel_at_deadline: true,
            wall: Arc::new(SystemWallClock),
        }
    }
}

/// Everything the services of one deadline layer share.
pub(crate) struct DeadlineState {
    pub(crate) skew_allowance: Duration,
    pub(crate) cancel_at_deadline: bool,
    wall: Arc<dyn WallClock>,
    metrics: LazyMetrics<DeadlineMetrics>,
    /// Requests expiring: begins at the first, ends after [`QUIET`] without one.
    expiring: Episode,
    /// Requests sent from the future: begins at the first, ends after [`QUIET`] without one.
    skew: Episode,
    /// The episodes' clock.
    clock: TokioClock,
    /// The callers' classes, keyed at random for each layer, so a caller cannot aim at one.
    classes: RandomState,
    /// The caller classes that sent an expired request this minute.
    expired_callers: CallerMinutes,
    /// The caller classes that sent a skewed request this minute.
    skewed_callers: CallerMinutes,
}

/// Who sent a request with a deadline, as far as the figures go: its caller class (by
/// network) and whether the layer's [`Trust`] takes its send times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeadlineCaller {
    class: u8,
    trusted: bool,
}

/// What a request's deadline says when it reaches the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// No deadline, neither on the request nor in the current scope: the request runs as
    /// long as it takes.
    Open,
    /// The caller still waits: its deadline, on this server's clock, and when to cancel the
    /// work (the deadline, plus the skew allowance when the deadline came with a send time).
    Live {
        deadline: RequestDeadline,
        cancel_at: Instant,
        caller: DeadlineCaller,
    },
    /// The deadline has passed (by more than the allowance): answer at once. `queued` is the
    /// time since the request was sent, when its send time is known and believed (0
    /// otherwise).
    Expired {
        queued: Duration,
        caller: DeadlineCaller,
    },
}

/// One source's reading of the deadline, before the earliest is kept.
#[derive(Clone, Copy)]
struct Reading {
    deadline: Instant,
    cancel_at: Instant,
}

impl DeadlineState {
    pub(crate) fn new(settings: DeadlineSettings) -> Self {
        Self {
            skew_allowance: settings.skew_allowance,
            cancel_at_deadline: settings.cancel_at_deadline,
            wall: settings.wall,
            metrics: LazyMetrics::new(settings.name),
            expiring: Episode::new(),
            skew: Episode::new(),
            clock: TokioClock::new(),
            classes: RandomState::new(),
            expired_callers: CallerMinutes::new(),
            skewed_callers: CallerMinutes::new(),
        }
    }

    pub(crate) const fn name(&self) -> &LayerName {
        self.metrics.name()
    }

    #[inline]
    fn metrics(&self) -> &DeadlineMetrics {
        self.metrics.get()
    }

    /// Reads the deadline of a request (with these headers and extensions, of this protocol)
    /// arriving now: the earliest of `X-Request-Deadline` (its send time believed only when
    /// `trust` trusts the caller), `grpc-timeout` (gRPC only) and Envoy's
    /// `x-envoy-expected-rq-timeout-ms` (relative, from anyone), a [`RequestDeadline`]
    /// already in its extensions, and the [current](current) deadline of the task calling
    /// the layer. `fields`: the deadline fields the request may carry.
    #[inline]
    pub(crate) fn arrive(
        &self,
        headers: &HeaderMap,
        extensions: &Extensions,
        protocol: Protocol,
        fields: RequestFields,
        trust: &Trust,
    ) -> Arrival {
        // NOTE: registered on the first request; an episode's end is noticed here too.
        let metrics = self.metrics();
        self.end_quiet_episodes();
        // NOTE: most requests carry no deadline: finding that out costs two or three header
        // lookups (none for a field `fields` says is absent), an extension lookup and a
        // task-local read, and the reading of a deadline is out of line, so that a server's
        // hot path carries none of its code.
        let has = |bit, name| fields.may_have(bit) && headers.contains_key(name);
        let any = has(RequestFields::X_REQUEST_DEADLINE, X_REQUEST_DEADLINE)
            || has(
                RequestFields::X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
                X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            )
            || (protocol.is_grpc() && has(RequestFields::GRPC_TIMEOUT, GRPC_TIMEOUT))
            || extensions.get::<RequestDeadline>().is_some()
            || current().is_some();
        if any {
            self.read_deadline(metrics, headers, extensions, protocol, trust)
        } else {
            Arrival::Open
        }
    }

    /// [`arrive`](Self::arrive) for a request that carries a deadline, or arrives in the
    /// scope of one.
    #[inline(never)]
    fn read_deadline(
        &self,
        metrics: &DeadlineMetrics,
        headers: &HeaderMap,
        extensions: &Extensions,
        protocol: Protocol,
        trust: &Trust,
    ) -> Arrival {
        metrics.with_deadline();
        let caller = DeadlineCaller {
            class: self.class_of(extensions),
            trusted: headers.contains_key(X_REQUEST_DEADLINE) && trust.trusts(headers, extensions),
        };
        // NOTE: the clock is read only when a deadline is found.
        let mut read = None;
        let mut now = || *read.get_or_insert_with(Instant::now);
        let mut earliest: Option<Reading> = None;
        let mut keep = |reading: Reading| {
            earliest = Some(match earliest {
                Some(e) => Reading {
                    deadline: e.deadline.min(reading.deadline),
                    cancel_at: e.cancel_at.min(reading.cancel_at),
                },
                None => reading,
            });
        };

        match WireDeadline::from_headers(headers) {
            Ok(None) => {}
            Ok(Some(wire)) => {
                // NOTE: tokio's clock first, the wall clock second. Time that passes between
                // the two reads (a thread preempted on a loaded host) then counts as time
                // the request queued, which moves the deadline earlier; read the other way
                // round, it would move it later, and a tier would pass on more time than its
                // caller has left (issue 30, finding 7).
                let now = now();
                // NOTE: an untrusted caller's send time is not read at all: its deadline
                // counts from arrival, which can only shorten its own request, and it can
                // neither pass for clock skew nor put a sample in the queued-time figure.
                let queued = if caller.trusted {
                    wire.queued(self.wall.now(), self.skew_allowance)
                        .filter(|queued| *queued <= MAX_QUEUED)
                } else {
                    None
                };
                let (queued, tolerance) = match queued {
                    Some(queued) => (queued, self.skew_allowance),
                    None => {
                        if caller.trusted {
                            self.skewed(metrics, caller);
                        }
                        (Duration::ZERO, Duration::ZERO)
                    }
                };
                match place(now, queued, wire.timeout(), tolerance) {
                    Some(reading) => keep(reading),
                    None => return Arrival::Expired { queued, caller },
                }
            }
            Err(malformed) => {
                metrics.malformed();
                tracing::debug!(%malformed, "ignoring X-Request-Deadline");
            }
        }
        // NOTE: the relative timeouts (gRPC's, Envoy's) have no send time: counted from
        // arrival, with no allowance, and believed from anyone, trusted or not: a caller can
        // only shorten its own request with them, and they show neither skew nor queue time.
        // gRPC-Web carries gRPC's `grpc-timeout` too; Envoy sets its own on every request it
        // forwards, HTTP and gRPC alike.
        let relative = [
            (
                protocol.is_grpc().then(|| grpc_timeout(headers)),
                GRPC_TIMEOUT,
            ),
            (
                Some(envoy_expected_rq_timeout(headers)),
                X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            ),
        ];
        for (read, field) in relative {
            let Some(read) = read else { continue };
            match read {
                Ok(None) => {}
                Ok(Some(timeout)) => {
                    // NOTE: only `grpc-timeout` can be zero here (Envoy's `0` is no deadline).
                    if timeout.is_zero() {
                        return Arrival::Expired {
                            queued: Duration::ZERO,
                            caller,
                        };
                    }
                    let deadline = RequestDeadline::after_from(now(), timeout).instant();
                    keep(Reading {
                        deadline,
                        cancel_at: deadline,
                    });
                }
                Err(malformed) => {
                    metrics.malformed();
                    tracing::debug!(%malformed, field = field.as_str(), "ignoring the field");
                }
            }
        }
        let given =
            RequestDeadline::earliest(extensions.get::<RequestDeadline>().copied(), current());
        if let Some(given) = given {
            let deadline = given.instant();
            if now() >= deadline {
                return Arrival::Expired {
                    queued: Duration::ZERO,
                    caller,
                };
            }
            keep(Reading {
                deadline,
                cancel_at: deadline,
            });
        }
        match earliest {
            None => Arrival::Open,
            Some(Reading {
                deadline,
                cancel_at,
            }) => Arrival::Live {
                deadline: RequestDeadline::at(deadline),
                cancel_at,
                caller,
            },
        }
    }

    /// The caller class of a request: its client's network, hashed; requests without a
    /// client address share one class more.
    fn class_of(&self, extensions: &Extensions) -> u8 {
        match client_addr(extensions) {
            Some(ip) => {
                (self.classes.hash_one(PeerIp::network_word(ip)) % u64::from(CALLER_CLASSES)) as u8
            }
            None => CALLER_CLASSES,
        }
    }

    /// Counts a request answered at once, expired, and logs it if it begins an episode (a
    /// trusted caller's only: anyone can send a zero timeout).
    pub(crate) fn expired_on_arrival(&self, queued: Duration, caller: DeadlineCaller) {
        let now = self.clock.now();
        let metrics = self.metrics();
        metrics.expired_on_arrival(queued);
        if self.expired_callers.first_this_minute(now, caller.class) {
            metrics.expired_caller();
        }
        if caller.trusted && self.expiring.seen(now) {
            expiring_began(self.name(), queued);
        }
    }

    /// Counts a request whose work was cancelled at its deadline.
    pub(crate) fn expired_running(&self, caller: DeadlineCaller) {
        let now = self.clock.now();
        let metrics = self.metrics();
        metrics.expired_running();
        if self.expired_callers.first_this_minute(now, caller.class) {
            metrics.expired_caller();
        }
        if caller.trusted && self.expiring.seen(now) {
            expiring_began(self.name(), Duration::ZERO);
        }
    }

    /// Counts a trusted caller's send time that the clocks cannot explain: further in the
    /// future than the allowance, or more than [`MAX_QUEUED`] in the past.
    fn skewed(&self, metrics: &DeadlineMetrics, caller: DeadlineCaller) {
        let now = self.clock.now();
        metrics.skewed();
        if self.skewed_callers.first_this_minute(now, caller.class) {
            metrics.skewed_caller();
        }
        if self.skew.seen(now) {
            skew_began(self.name(), self.skew_allowance);
        }
    }

    #[inline]
    fn end_quiet_episodes(&self) {
        if self.expiring.is_active() || self.skew.is_active() {
            self.end_episodes();
        }
    }

    #[cold]
    fn end_episodes(&self) {
        let now = self.clock.now();
        if let Some(ended) = self.expiring.quiet_for(QUIET, now) {
            expiring_ended(self.name(), ended, QUIET);
        }
        if let Some(ended) = self.skew.quiet_for(QUIET, now) {
            skew_ended(self.name(), ended, QUIET);
        }
    }
}

/// Where a deadline read from `X-Request-Deadline` falls on this server's clock, for a
/// request read `now`, `queued` after its send time (zero for a send time in the future),
/// with the caller's `timeout` and the skew `tolerance` (the allowance; zero when the send
/// time is not trusted); `None` when the request is expired on arrival.
///
/// - Expired: `queued >= timeout + tolerance` (the deadline passed by more than the
///   allowance), or a zero `timeout`: the caller gave the work no time at all, whatever the
///   clocks say, and a handler admitted with none could only fail its downstream calls.
/// - Otherwise the work is cancelled at `now + timeout + tolerance - queued`: the deadline
///   plus the allowance, since this server's clock may be that far ahead of the caller's.
/// - The deadline the handler reads, and passes on, is `now + timeout - queued` while that
///   is after `now`: the caller's, as the two clocks place it, never more than it has left.
/// - When that has already passed (the request is admitted inside the allowance only
///   because this server's clock may be ahead), it is the cancellation, but never more than
///   `timeout` from now: the layer bets that the clocks disagree by enough for the caller
///   to still wait, and its downstream calls get the same bet rather than failing at once,
///   with never more than the caller gave.
///
/// Every admitted request thus has a deadline after `now`, and at most `timeout` after it.
fn place(
    now: Instant,
    queued: Duration,
    timeout: Duration,
    tolerance: Duration,
) -> Option<Reading> {
    let until_cancel = timeout.saturating_add(tolerance).checked_sub(queued)?;
    if until_cancel.is_zero() || timeout.is_zero() {
        return None;
    }
    let left = match timeout.checked_sub(queued) {
        Some(left) if !left.is_zero() => left,
        // NOTE: admitted inside the allowance: 0 < until_cancel <= tolerance.
        _ => until_cancel.min(timeout),
    };
    let deadline = RequestDeadline::after_from(now, left).instant();
    // NOTE: `left <= until_cancel`, so the work is never cancelled before its deadline.
    let cancel_at = deadline
        .checked_add(until_cancel - left)
        .unwrap_or(deadline);
    Some(Reading {
        deadline,
        cancel_at,
    })
}

/// The caller classes seen in the current minute, to count each class once a minute: how
/// many callers a figure comes from, which a count of requests cannot tell (one caller can
/// send any number).
///
/// Approximate by design: a request that races the turn of the minute may be counted in
/// both, or its class seen in the old minute only.
struct CallerMinutes {
    /// One more than the index of the minute `seen` is for (0: none yet).
    minute: AtomicU64,
    /// A bit per class, `CALLER_CLASSES + 1` of them.
    seen: [AtomicU64; 3],
}

impl CallerMinutes {
    const MINUTE_NANOS: u64 = 60_000_000_000;

    fn new() -> Self {
        Self {
            minute: AtomicU64::new(0),
            seen: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Whether `class` is seen for the first time in the minute of `now` (nanoseconds on the
    /// layer's clock), noting it.
    fn first_this_minute(&self, now: u64, class: u8) -> bool {
        let minute = now / Self::MINUTE_NANOS + 1;
        let current = self.minute.load(Ordering::Acquire);
        if current != minute
            && self
                .minute
                .compare_exchange(current, minute, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            for word in &self.seen {
                word.store(0, Ordering::Release);
            }
        }
        let bit = 1u64 << (class % 64);
        self.seen[usize::from(class / 64)].fetch_or(bit, Ordering::AcqRel) & bit == 0
    }
}

impl fmt::Debug for DeadlineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineState")
            .field("name", self.name())
            .field("skew_allowance", &self.skew_allowance)
            .field("cancel_at_deadline", &self.cancel_at_deadline)
            .finish_non_exhaustive()
    }
}
