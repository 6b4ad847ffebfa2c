//! [`StopSignals`]: whose stop signals a retry layer passes up to the server it runs in.

use http::HeaderMap;
use overload_signal::protocol::{
    self, GRPC_RETRY_PUSHBACK_MS, X_ENVOY_OVERLOADED, X_ENVOY_RATELIMITED, X_OVERLOADED,
};

/// What a retry layer does with a downstream's stop signal (`X-Overloaded`, a negative
/// `grpc-retry-pushback-ms`, or Envoy's `x-envoy-overloaded` or `x-envoy-ratelimited: true`:
/// see [`is_stop_signal`](overload_signal::protocol::is_stop_signal)) besides honouring it. Set with
/// [`RetryBuilder::stop_signals`](crate::RetryBuilder::stop_signals).
///
/// Whatever the setting, a failure carrying the stop signal is **never retried** and is
/// counted in `backoff_layer_stop_signals_total`. What differs is whether the signal goes
/// further up, to the callers of the server this client runs in:
///
/// | setting | the caller of the layer gets | the request's propagation scope | the callers of our server |
/// |---|---|---|---|
/// | [`PassUp`](Self::PassUp) (default) | `Err`, an [`Overloaded`](crate::Overloaded) (tonic: `UNAVAILABLE` with `x-overloaded`) | marked with the stop signal | told to stop too, by the overload layer |
/// | [`HonourOnly`](Self::HonourOnly) | `Ok`, the failure itself with the stop signal taken out, [`RetryInfo`](crate::RetryInfo) `{ gave_up: Some(`[`GiveUpReason::StopSignal`](crate::GiveUpReason::StopSignal)`) }` (tonic: the failure's own `Status`, without it) | marked [gave up](overload_signal::propagation::Downstream::GaveUp), not with the stop signal | a failure of ours, which their own retry layers judge as any other |
///
/// **Whose signals to pass up.** The stop signal asks every tier above to stop retrying:
/// passing it up is right when the downstream is ours (a service of the same organisation,
/// judged by the same rule, whose overload is our callers' business), which is why it is
/// the default. A **third party** (a payment provider, a webhook receiver, any API you do
/// not run) that adds `X-Overloaded` to a `5xx`, by design or by accident, would otherwise
/// make our server tell its own callers to stop: set [`HonourOnly`](Self::HonourOnly) on
/// the layer in front of it. Honouring is kept either way: the third party is not retried.
/// The same holds for Envoy's signals: behind an Envoy of your own (a sidecar, a gateway of
/// the same organisation), its shedding (`x-envoy-overloaded`) and rate limiting
/// (`x-envoy-ratelimited`) are your fleet's overload, passed up by default; in front of a
/// third party that runs Envoy, [`HonourOnly`](Self::HonourOnly) keeps them from reaching
/// your callers (they are taken out of the failure, as ours are).
///
/// A layer decides for the signals it receives in responses. A retry layer nested below it
/// decides for its own: an [`Overloaded`](crate::Overloaded) it returns is passed on
/// unchanged (what a retry layer gave up on is final above it); set the switch on the
/// innermost layer.
///
/// ```
/// use backoff_layer::{RetryLayer, StopSignals};
///
/// // Calls to our own services: their stop signals are ours to pass up (the default).
/// let internal = RetryLayer::builder().name("inventory").build()?;
/// // Calls to a third-party API: honoured, never passed up to our callers.
/// let external = RetryLayer::builder()
///     .name("payments-provider")
///     .stop_signals(StopSignals::HonourOnly)
///     .build()?;
/// # let _ = (internal, external);
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopSignals {
    /// Honoured and passed up: the failure is not retried, the caller gets an
    /// [`Overloaded`](crate::Overloaded), and the request's propagation scope is marked, so
    /// that the overload layer of the server this client runs in answers its own caller
    /// with the stop signal. For downstreams of the same organisation. The default.
    #[default]
    PassUp,
    /// Honoured only: the failure is not retried, and it is returned as it came, with the
    /// stop signal taken out (`X-Overloaded`, `x-envoy-overloaded`, `x-envoy-ratelimited`,
    /// and a negative `grpc-retry-pushback-ms`), its
    /// [`RetryInfo`](crate::RetryInfo) saying
    /// [`GiveUpReason::StopSignal`](crate::GiveUpReason::StopSignal); the propagation scope
    /// is marked as a call given up on, never with the stop signal. Passed back verbatim by
    /// a gateway's handler, it is a plain failure (`503`, gRPC `UNAVAILABLE`), which the
    /// callers' retry layers judge with their own budgets. For third parties.
    HonourOnly,
}

/// Takes the stop signal out of a failure's headers: `X-Overloaded`, Envoy's
/// `x-envoy-overloaded` and `x-envoy-ratelimited`, and a `grpc-retry-pushback-ms` that says
/// stop (negative, or not a number). A pushback that asks for a wait is kept.
pub(crate) fn remove_stop_signal(headers: &mut HeaderMap) {
    headers.remove(X_OVERLOADED);
    headers.remove(X_ENVOY_OVERLOADED);
    headers.remove(X_ENVOY_RATELIMITED);
    if protocol::is_stop_signal(headers) {
        headers.remove(GRPC_RETRY_PUSHBACK_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_signal_is_taken_out_and_nothing_else() {
        let mut headers = HeaderMap::new();
        headers.insert("x-overloaded", "stop-retrying".parse().unwrap());
        headers.insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
        headers.insert("grpc-status", "14".parse().unwrap());
        remove_stop_signal(&mut headers);
        assert!(!protocol::is_stop_signal(&headers));
        assert_eq!(headers.len(), 1, "{headers:?}");
        let mut wait = HeaderMap::new();
        wait.insert("x-overloaded", "".parse().unwrap());
        wait.insert("grpc-retry-pushback-ms", "250".parse().unwrap());
        remove_stop_signal(&mut wait);
        assert_eq!(wait.get("grpc-retry-pushback-ms").unwrap(), "250");
        assert!(!protocol::is_stop_signal(&wait));
        let mut garbage = HeaderMap::new();
        garbage.insert("grpc-retry-pushback-ms", "soon".parse().unwrap());
        remove_stop_signal(&mut garbage);
        assert!(garbage.is_empty());
    }
}
