//! A request's deadline: the layer's own, folded with the one its caller gave, and what each
//! attempt tells the server of it.
//!
//! The caller's deadline is the earliest of a [`RequestDeadline`] in the request's
//! extensions, the [current](deadline::current) deadline of the task calling the layer (a
//! handler behind `overload-signal`'s `DeadlineLayer`), and a deadline field already on the
//! request (`grpc-timeout` on a gRPC request, as tonic's `Request::set_timeout` writes it;
//! `X-Request-Deadline` on an HTTP one). No attempt is sent after it and no wait passes it;
//! each attempt carries what is left, never more than the caller gave.

use http::HeaderMap;
use http::request::Parts;
use overload_signal::DeadlineLayer;
use overload_signal::deadline::{self, RequestDeadline};
use overload_signal::protocol::{
    GRPC_TIMEOUT, WireDeadline, format_grpc_timeout, grpc_timeout, is_grpc,
};
use tokio::time::Instant;

use super::config::RetryConfig;

/// How each attempt of a request tells the server how long it is waited for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OnWire {
    /// Nothing: no deadline or timeout to tell, or a gRPC request under the default deadline
    /// alone.
    Nothing,
    /// `X-Request-Deadline`: the attempt's window, whatever bounds it, the default deadline
    /// included: the field promises a wait for the response's head, which is what the
    /// layer's deadline bounds, and a server's deadline layer never cuts a body.
    Http,
    /// `grpc-timeout`: the time until the earlier of the attempt's timeout and `limit` (a
    /// deadline set on the layer, or the caller's). Never the default deadline: a gRPC
    /// server applies `grpc-timeout` to the whole call, and would end a long
    /// server-streaming call at 15 s.
    Grpc { limit: Option<Instant> },
}

/// The clock-related facts of a request, settled before its first attempt is sent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// The earliest of the layer's deadline and the caller's.
    pub(crate) deadline: Option<Instant>,
    pub(crate) wire: OnWire,
    /// When the first attempt must end, and whether that is the deadline.
    pub(crate) window: Option<(Instant, bool)>,
    /// Whether the caller's deadline had passed before the first attempt: nothing is sent.
    pub(crate) passed: bool,
}

impl Timing {
    const UNTIMED: Self = Self {
        deadline: None,
        wire: OnWire::Nothing,
        window: None,
        passed: false,
    };

    /// The timing of a request whose first attempt has these `parts`; sets the attempt's
    /// deadline field (`X-Request-Deadline` or `grpc-timeout`).
    ///
    /// The clock is read only when a timer may be needed (a deadline, the layer's or the
    /// caller's, or a per-attempt timeout): the happy path of a layer without either does
    /// not read it.
    #[inline]
    pub(crate) fn first(config: &RetryConfig, parts: &mut Parts) -> Self {
        let given = RequestDeadline::earliest(
            parts.extensions.get::<RequestDeadline>().copied(),
            deadline::current(),
        );
        // NOTE: an empty map is checked first: a lookup in it is not free.
        let grpc = !parts.headers.is_empty() && is_grpc(&parts.headers);
        let field = if parts.headers.is_empty() {
            None
        } else {
            CallerField::read(&parts.headers, grpc)
        };
        if config.deadline.is_none()
            && config.attempt_timeout.is_none()
            && given.is_none()
            && field.is_none()
        {
            return Self::UNTIMED;
        }
        let now = Instant::now();
        let caller = RequestDeadline::earliest(given, field.map(|f| f.place(config, now)))
            .map(RequestDeadline::instant);
        // NOTE: a deadline too far to represent is no deadline.
        let own = config.deadline.and_then(|d| now.checked_add(d));
        let deadline = earliest(own, caller);
        let wire = if !grpc {
            OnWire::Http
        } else if config.deadline_on_wire {
            OnWire::Grpc { limit: deadline }
        } else if caller.is_some() || config.attempt_timeout.is_some() {
            OnWire::Grpc { limit: caller }
        } else {
            OnWire::Nothing
        };
        if deadline.is_some_and(|d| d <= now) {
            return Self {
                deadline,
                wire,
                window: None,
                passed: true,
            };
        }
        let window = attempt_window(config, deadline, wire, now, &mut parts.headers);
        Self {
            deadline,
            wire,
            window,
            passed: false,
        }
    }
}

/// When an attempt starting `now` must end (its timeout or the deadline, whichever is
/// first), and whether that is the deadline; sets the attempt's deadline field as `wire`
/// says. `None` when the attempt has no end.
#[inline]
pub(crate) fn attempt_window(
    config: &RetryConfig,
    deadline: Option<Instant>,
    wire: OnWire,
    now: Instant,
    headers: &mut HeaderMap,
) -> Option<(Instant, bool)> {
    let timeout = config.attempt_timeout.and_then(|t| now.checked_add(t));
    let window = match (timeout, deadline) {
        (Some(t), Some(d)) if d <= t => (d, true),
        (Some(t), _) => (t, false),
        (None, Some(d)) => (d, true),
        (None, None) => return None,
    };
    match wire {
        OnWire::Nothing => {}
        OnWire::Http => {
            // NOTE: the wall clock first, then tokio's for the time left: a pause between
            // the two reads (a preempted thread) then only shortens the field's deadline
            // (`t + timeout`), never moves it past the caller's.
            let sent = config.wall.now();
            WireDeadline::new(sent, window.0.saturating_duration_since(Instant::now()))
                .set(headers);
        }
        OnWire::Grpc { limit } => {
            if let Some(end) = earliest(timeout, limit) {
                headers.insert(
                    GRPC_TIMEOUT,
                    format_grpc_timeout(end.saturating_duration_since(now)),
                );
            }
        }
    }
    Some(window)
}

/// A deadline field the caller put on the request.
#[derive(Clone, Copy, Debug)]
enum CallerField {
    /// `grpc-timeout`: from now.
    Grpc(std::time::Duration),
    /// `X-Request-Deadline`: from its send time, on the caller's clock.
    Http(WireDeadline),
}

impl CallerField {
    /// The field on a request with these headers, if it is there and well-formed. A
    /// malformed one is no deadline; it is replaced on the wire when the attempt carries a
    /// deadline of the layer's.
    fn read(headers: &HeaderMap, grpc: bool) -> Option<Self> {
        if grpc {
            grpc_timeout(headers).ok().flatten().map(Self::Grpc)
        } else {
            WireDeadline::from_headers(headers)
                .ok()
                .flatten()
                .map(Self::Http)
        }
    }

    /// The deadline the field gives, on this host's clock. A send time is trusted as a
    /// server's `DeadlineLayer` trusts it (within its default skew allowance), but without
    /// tolerance: a field forwarded from another host never buys more time than it says.
    fn place(self, config: &RetryConfig, now: Instant) -> RequestDeadline {
        let timeout = match self {
            Self::Grpc(timeout) => timeout,
            Self::Http(wire) => {
                let queued = wire
                    .queued(config.wall.now(), DeadlineLayer::DEFAULT_SKEW_ALLOWANCE)
                    .unwrap_or_default();
                wire.timeout().saturating_sub(queued)
            }
        };
        RequestDeadline::at(
            now.checked_add(timeout)
                .or_else(|| now.checked_add(FAR_FUTURE))
                .unwrap_or(now),
        )
    }
}

/// What a timeout too long to represent is: about 30 years, tokio's own "far future".
const FAR_FUTURE: std::time::Duration = std::time::Duration::from_secs(86_400 * 365 * 30);

/// The earlier of two instants, either of which may be absent.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
