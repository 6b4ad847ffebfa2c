//! The retry layer's spans and events: one span per request, one child span per attempt,
//! named and attributed after OpenTelemetry's HTTP client conventions (see the crate docs'
//! "Traces" for the table).
//!
//! Everything here is at `DEBUG` and costs a check of the global maximum level when no
//! subscriber takes `DEBUG` (then a cached callsite interest when one takes it elsewhere):
//! the target's fields are computed only past that check, and every `record_*` returns at
//! once on a disabled span. Nothing allocates: the URL is formatted by the subscriber, through a
//! `Display` that borrows the request's URI.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use http::request::Parts;
use http::{Response, Uri};
use overload_signal::is_overloaded;
use overload_signal::protocol::{GRPC_STATUS, Outcome, Protocol};
use tracing::field::Empty;
use tracing::{Level, Span};

use super::stop::StopSignals;
use crate::BoxError;
use crate::classify::{is_connect_error, is_timeout};
use crate::outcome::{GaveUp, GiveUpReason};
use crate::throttle::is_throttled;

/// Why the layer waits before a retry: the `cause` of a `retry wait` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitCause {
    /// The backoff strategy's delay.
    Backoff,
    /// The server's `Retry-After`, longer than the backoff's delay.
    RetryAfter,
    /// The server's `grpc-retry-pushback-ms`, longer than the backoff's delay.
    Pushback,
}

impl WaitCause {
    /// The cause of a wait of the longer of `backoff` and the server's hint (its wait, and
    /// whether a gRPC pushback gave it): the backoff's on a tie.
    pub(crate) fn of(backoff: Duration, hint: Option<(Duration, bool)>) -> Self {
        match hint {
            Some((wait, false)) if wait > backoff => WaitCause::RetryAfter,
            Some((wait, true)) if wait > backoff => WaitCause::Pushback,
            _ => WaitCause::Backoff,
        }
    }

    const fn as_str(self) -> &'static str {
        match self {
            WaitCause::Backoff => "backoff",
            WaitCause::RetryAfter => "retry_after",
            WaitCause::Pushback => "pushback",
        }
    }
}

/// What the spans say of a request's target, borrowed from its parts.
struct SpanTarget<'a> {
    method: &'a str,
    /// `server.address`: the URI's host, brackets of an IPv6 literal taken off.
    address: Option<&'a str>,
    /// `server.port`: the URI's port, or the scheme's (80, 443).
    port: Option<u16>,
    /// `url.full`, when the URI is absolute.
    url: Option<UrlFull<'a>>,
    /// For gRPC: `rpc.service` and `rpc.method`, from the path `/package.Service/Method`.
    rpc: Option<(&'a str, &'a str)>,
    /// `otel.name`: the method (HTTP), or `package.Service/Method` (gRPC).
    name: &'a str,
}

impl<'a> SpanTarget<'a> {
    fn of(parts: &'a Parts) -> Self {
        let uri = &parts.uri;
        let address = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'));
        let port = address.and_then(|_| {
            uri.port_u16().or(match uri.scheme_str() {
                Some("https") => Some(443),
                Some("http") => Some(80),
                _ => None,
            })
        });
        let url = (uri.scheme().is_some() && address.is_some()).then_some(UrlFull(uri));
        let method = parts.method.as_str();
        let rpc = Protocol::of_headers(&parts.headers)
            .is_grpc()
            .then(|| {
                let path = uri.path().strip_prefix('/')?;
                path.split_once('/').map(|call| (path, call))
            })
            .flatten();
        match rpc {
            Some((path, (service, rpc_method))) => Self {
                method,
                address,
                port,
                url,
                rpc: Some((service, rpc_method)),
                name: path,
            },
            None => Self {
                method,
                address,
                port,
                url,
                rpc: None,
                name: method,
            },
        }
    }
}

impl SpanTarget<'_> {
    /// `rpc.system`, `rpc.service` and `rpc.method`: all three for gRPC, none otherwise.
    fn rpc_fields(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        match self.rpc {
            Some((service, method)) => (Some("grpc"), Some(service), Some(method)),
            None => (None, None, None),
        }
    }
}

/// `url.full` as OpenTelemetry asks it to be: without the user and password an authority
/// may carry, and with the value of every query parameter replaced by `REDACTED` (query
/// strings carry tokens, signatures and keys; their names are kept).
#[derive(Clone, Copy)]
struct UrlFull<'a>(&'a Uri);

impl fmt::Display for UrlFull<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uri = self.0;
        if let Some(scheme) = uri.scheme_str() {
            write!(f, "{scheme}://")?;
        }
        if let Some(host) = uri.host() {
            f.write_str(host)?;
        }
        if let Some(port) = uri.port() {
            write!(f, ":{port}")?;
        }
        f.write_str(uri.path())?;
        if let Some(query) = uri.query() {
            f.write_str("?")?;
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    f.write_str("&")?;
                }
                match pair.split_once('=') {
                    Some((name, _)) => write!(f, "{name}=REDACTED")?,
                    None => f.write_str(pair)?,
                }
            }
        }
        Ok(())
    }
}

/// The span of one request through the layer, a child of the caller's current span:
/// `otel.kind` `internal` (OpenTelemetry's HTTP client span is each physical request: the
/// attempts below).
#[inline]
pub(crate) fn request_span(parts: &Parts) -> Span {
    // NOTE: the convention asks for the target's attributes at the span's creation (a
    // sampler may read them): computed only when some subscriber takes `DEBUG` at all.
    if !tracing::level_enabled!(Level::DEBUG) {
        return Span::none();
    }
    let target = SpanTarget::of(parts);
    tracing::debug_span!(
        "retry",
        otel.name = target.name,
        otel.kind = "internal",
        http.request.method = target.method,
        server.address = target.address,
        server.port = target.port,
        url.full = target.url.map(display),
        http.response.status_code = Empty,
        "error.type" = Empty,
        rpc.grpc.status_code = Empty,
        retry.attempts = Empty,
        retry.gave_up = Empty,
    )
}

/// The span of the first attempt (`http.request.resend_count` absent, as the convention
/// asks), a child of the request's span.
#[inline]
pub(crate) fn first_attempt_span(request: &Span, parts: &Parts) -> Span {
    if !tracing::level_enabled!(Level::DEBUG) {
        return Span::none();
    }
    let target = SpanTarget::of(parts);
    let (rpc_system, rpc_service, rpc_method) = target.rpc_fields();
    tracing::debug_span!(
        parent: request,
        "attempt",
        attempt = 0u32,
        otel.name = target.name,
        otel.kind = "client",
        http.request.method = target.method,
        server.address = target.address,
        server.port = target.port,
        url.full = target.url.map(display),
        rpc.system = rpc_system,
        rpc.service = rpc_service,
        rpc.method = rpc_method,
        http.response.status_code = Empty,
        "error.type" = Empty,
        rpc.grpc.status_code = Empty,
    )
}

/// The span of retry number `resend_count` (1 for the first retry), a child of the
/// request's span; `parts` are the request's.
pub(crate) fn retry_span(request: &Span, parts: &Option<Parts>, resend_count: u32) -> Span {
    // NOTE: `parts` are always there: a retry is decided only with the request's parts.
    let (true, Some(parts)) = (tracing::level_enabled!(Level::DEBUG), parts) else {
        return Span::none();
    };
    let target = SpanTarget::of(parts);
    let (rpc_system, rpc_service, rpc_method) = target.rpc_fields();
    tracing::debug_span!(
        parent: request,
        "attempt",
        attempt = resend_count,
        otel.name = target.name,
        otel.kind = "client",
        http.request.method = target.method,
        server.address = target.address,
        server.port = target.port,
        url.full = target.url.map(display),
        rpc.system = rpc_system,
        rpc.service = rpc_service,
        rpc.method = rpc_method,
        http.request.resend_count = resend_count,
        http.response.status_code = Empty,
        "error.type" = Empty,
        rpc.grpc.status_code = Empty,
    )
}

/// Records an attempt's (or the request's last) outcome: the status, the gRPC status in
/// the answer's head, and `error.type` for a failure.
#[inline]
pub(crate) fn record_outcome<B>(span: &Span, outcome: &Result<Response<B>, BoxError>) {
    if span.is_disabled() {
        return;
    }
    record_outcome_slow(span, outcome);
}

#[cold]
fn record_outcome_slow<B>(span: &Span, outcome: &Result<Response<B>, BoxError>) {
    match outcome {
        Ok(response) => {
            let (status, headers) = (response.status(), response.headers());
            span.record("http.response.status_code", status.as_u16());
            let answer = Outcome::of_response(Protocol::of_headers(headers), status, headers);
            if let Some(code) = answer.grpc_status() {
                span.record("rpc.grpc.status_code", code);
                if code != 0 {
                    // NOTE: the header's own text: the code as a string, no allocation.
                    let text = headers.get(GRPC_STATUS).and_then(|v| v.to_str().ok());
                    span.record("error.type", text);
                }
            } else if status.is_client_error() || status.is_server_error() {
                span.record("error.type", status.as_str());
            }
        }
        Err(e) => {
            span.record("error.type", error_type(&**e));
        }
    }
}

/// `error.type` of an error in place of an answer: a low-cardinality kind, OpenTelemetry's
/// `_OTHER` when none fits.
fn error_type(error: &(dyn Error + 'static)) -> &'static str {
    // What a layer below gave up on is typed by what its last attempt met.
    if let Some(inner) = error.downcast_ref::<GaveUp>().and_then(Error::source) {
        return error_type(inner);
    }
    if is_overloaded(error) {
        "overloaded"
    } else if is_throttled(error) {
        "throttled"
    } else if is_timeout(error) {
        "timeout"
    } else if is_connect_error(error) {
        "connect"
    } else {
        "_OTHER"
    }
}

/// Records what the request came to on its span: the last outcome, the attempts sent,
/// and why the layer gave up, if it did.
#[inline]
pub(crate) fn record_request<B>(
    span: &Span,
    outcome: &Result<Response<B>, BoxError>,
    attempts: u32,
    gave_up: Option<GiveUpReason>,
) {
    if span.is_disabled() {
        return;
    }
    record_outcome_slow(span, outcome);
    span.record("retry.attempts", attempts);
    if let Some(reason) = gave_up {
        span.record("retry.gave_up", reason.as_str());
    }
}

/// The `retry wait` event: the layer waits `delay` before retry number `resend_count`.
#[inline]
pub(crate) fn wait(span: &Span, delay: Duration, cause: WaitCause, resend_count: u32) {
    span.in_scope(|| {
        tracing::debug!(
            duration_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            cause = cause.as_str(),
            http.request.resend_count = resend_count,
            "retry wait"
        );
    });
}

/// The `throttle refused` event: the client-side throttle refused the request; nothing
/// was sent.
#[cold]
pub(crate) fn throttle_refused(span: &Span) {
    span.record("error.type", "throttled");
    span.record("retry.attempts", 0u32);
    span.in_scope(|| tracing::debug!("throttle refused"));
}

/// The `budget refused` event: the retry budget refused a retry.
#[cold]
pub(crate) fn budget_refused(span: &Span, attempts: u32) {
    span.in_scope(|| tracing::debug!(retry.attempts = attempts, "budget refused"));
}

/// The `stop signal` event: an attempt's failure (`outcome`) carried the stop signal; the
/// request ends with it.
#[cold]
pub(crate) fn stop_signal<B>(
    span: &Span,
    outcome: &Result<Response<B>, BoxError>,
    attempts: u32,
    policy: StopSignals,
) {
    record_request(span, outcome, attempts, Some(GiveUpReason::StopSignal));
    let policy = match policy {
        StopSignals::PassUp => "pass_up",
        StopSignals::HonourOnly => "honour_only",
    };
    span.in_scope(|| {
        tracing::debug!(retry.attempts = attempts, policy, "stop signal");
    });
}

/// The `gave up` event: the layer stopped retrying a retryable failure.
#[cold]
pub(crate) fn gave_up(span: &Span, attempts: u32, reason: GiveUpReason) {
    span.in_scope(|| {
        tracing::debug!(
            retry.attempts = attempts,
            reason = reason.as_str(),
            "gave up"
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(uri: &str) -> String {
        UrlFull(&uri.parse().unwrap()).to_string()
    }

    #[test]
    fn url_full_leaves_out_credentials_and_query_values() {
        assert_eq!(
            url("http://127.0.0.1:8070/api"),
            "http://127.0.0.1:8070/api"
        );
        assert_eq!(
            url("https://user:secret@example.com/a/b?token=abc&x=1&flag"),
            "https://example.com/a/b?token=REDACTED&x=REDACTED&flag"
        );
        assert_eq!(url("http://[::1]:80/"), "http://[::1]:80/");
    }

    #[test]
    fn target_reads_address_port_and_grpc_call() {
        let (parts, ()) = http::Request::get("https://[::1]/pkg.Svc/Call")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
            .into_parts();
        let target = SpanTarget::of(&parts);
        assert_eq!(target.address, Some("::1"));
        assert_eq!(target.port, Some(443));
        assert_eq!(target.rpc, Some(("pkg.Svc", "Call")));
        assert_eq!(target.name, "pkg.Svc/Call");
        let (parts, ()) = http::Request::post("/relative")
            .body(())
            .unwrap()
            .into_parts();
        let target = SpanTarget::of(&parts);
        assert_eq!((target.address, target.port), (None, None));
        assert!(target.url.is_none());
        assert_eq!(target.name, "POST");
    }

    #[test]
    fn error_types_are_low_cardinality_kinds() {
        use crate::outcome::AttemptTimedOut;
        assert_eq!(error_type(&AttemptTimedOut::new()), "timeout");
        assert_eq!(error_type(&std::io::Error::other("x")), "_OTHER");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(error_type(&refused), "connect");
    }
}
