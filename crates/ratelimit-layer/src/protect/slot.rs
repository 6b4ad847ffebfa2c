//! What the deadline slot of an [`OverloadProtectionLayer`](super::OverloadProtectionLayer)
//! may hold, and the service the protection makes with each.

use overload_core::clock::Clock;
use overload_signal::signal::OverloadSignal;
use overload_signal::signal_deadline::{SignalDeadline, SignalDeadlineLayer};
use overload_signal::{DeadlineLayer, OverloadSignalLayer, Trust};
use tower_layer::{Identity, Layer};

/// What [`OverloadProtectionLayerBuilder::deadline`](super::OverloadProtectionLayerBuilder::deadline) may hold: no deadline layer
/// ([`Identity`], the default) or `overload-signal`'s `DeadlineLayer`. Sealed: it lets
/// [`OverloadProtectionLayerBuilder::trust`](super::OverloadProtectionLayerBuilder::trust) reach the deadline layer when there is one,
/// and [`OverloadProtectionLayer`](super::OverloadProtectionLayer) put the overload layer around it.
pub trait DeadlineSlot: sealed::Sealed + Sized {
    /// The service of the overload layer (with this deadline layer, if any) around the
    /// limiter's service `S`: `OverloadSignal<S, C>` without a deadline layer,
    /// `SignalDeadline<S, C>` (the two layers as one) with one.
    #[doc(hidden)]
    type Protected<S, C: Clock>;

    /// The overload layer `signal` (with this deadline layer inside it, if any) around the
    /// limiter's service `limited`.
    #[doc(hidden)]
    fn protect<S, C: Clock>(
        &self,
        signal: &OverloadSignalLayer<C>,
        limited: S,
    ) -> Self::Protected<S, C>;

    /// The trust set on the deadline layer, if any.
    #[doc(hidden)]
    fn trust_set(&self) -> Option<&Trust>;

    /// The deadline layer believing `trust`'s callers.
    #[doc(hidden)]
    #[must_use]
    fn with_trust(self, trust: Trust) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tower_layer::Identity {}
    impl Sealed for overload_signal::DeadlineLayer {}
}

impl DeadlineSlot for Identity {
    type Protected<S, C: Clock> = OverloadSignal<S, C>;

    fn protect<S, C: Clock>(
        &self,
        signal: &OverloadSignalLayer<C>,
        limited: S,
    ) -> Self::Protected<S, C> {
        signal.layer(limited)
    }

    fn trust_set(&self) -> Option<&Trust> {
        None
    }

    fn with_trust(self, _: Trust) -> Self {
        self
    }
}

impl DeadlineSlot for DeadlineLayer {
    type Protected<S, C: Clock> = SignalDeadline<S, C>;

    // NOTE: the two layers as one service (issue 34): one clone, one allocation of state,
    // one pass over the request's header names, for the same behaviour as the deadline
    // layer stacked inside the overload layer.
    fn protect<S, C: Clock>(
        &self,
        signal: &OverloadSignalLayer<C>,
        limited: S,
    ) -> Self::Protected<S, C> {
        SignalDeadlineLayer::new(signal, self).layer(limited)
    }

    fn trust_set(&self) -> Option<&Trust> {
        self.trust()
    }

    fn with_trust(self, trust: Trust) -> Self {
        Self::with_trust(self, trust)
    }
}
