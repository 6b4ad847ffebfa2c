//! The settings with which a request's level is resolved, shared by
//! [`CriticalityLayer`](crate::CriticalityLayer)'s services and by the overload layer when it
//! resolves levels itself.
//!
//! NOTE: here, under `signal`, not under `criticality`: resolving a level reads the trust
//! (`signal::trust`), and the overload layer resolves levels; `criticality` imports from
//! `signal`, never the other way round.

use std::fmt;

use http::{Extensions, HeaderMap};
use metrics::Counter;
use overload_core::telemetry::{LayerName, LazyMetrics, MetricSet, NAME_LABEL};

use super::trust::Trust;
use crate::metric_names;
use crate::protocol::{Criticality, RequestFields};

/// What every service of a [`CriticalityLayer`](crate::CriticalityLayer) shares.
pub(crate) struct CriticalitySettings {
    pub(crate) default_level: Criticality,
    pub(crate) untrusted_max: Criticality,
    pub(crate) trust: Trust,
    /// Whether `trust` was set rather than defaulted.
    pub(crate) trust_set: bool,
    metrics: LazyMetrics<CriticalityMetrics>,
}

impl CriticalitySettings {
    /// The settings named `name`, trusting `trust` (the default when `None`).
    pub(crate) fn new(
        name: LayerName,
        default_level: Criticality,
        untrusted_max: Criticality,
        trust: Option<Trust>,
    ) -> Self {
        Self {
            default_level,
            untrusted_max,
            trust_set: trust.is_some(),
            trust: trust.unwrap_or_default(),
            metrics: LazyMetrics::new(name),
        }
    }

    /// The name of the layer these settings belong to: the `name` label of its metrics.
    pub(crate) fn name(&self) -> &LayerName {
        self.metrics.name()
    }

    /// The level of a request with these headers and extensions, of which `fields` says
    /// which protocol fields it may carry.
    ///
    /// NOTE: a level in the extensions comes from the server's own code and is taken as it
    /// is; a level on the wire is the caller's word, capped unless the caller is trusted.
    #[inline]
    pub(crate) fn resolve(
        &self,
        headers: &HeaderMap,
        extensions: &Extensions,
        fields: RequestFields,
    ) -> Criticality {
        if let Some(level) = extensions.get::<Criticality>() {
            return *level;
        }
        let claimed = if fields.may_have(RequestFields::X_REQUEST_CRITICALITY) {
            let claimed = Criticality::from_headers(headers);
            if claimed.is_none() && headers.contains_key(crate::protocol::X_REQUEST_CRITICALITY) {
                self.metrics.get().malformed.increment(1);
            }
            claimed
        } else {
            None
        };
        let level = claimed.unwrap_or(self.default_level);
        // NOTE: the trust check (an address parse at worst) only when it can change the level.
        if level > self.untrusted_max && !self.trust.trusts(headers, extensions) {
            if claimed.is_some() {
                self.metrics.get().capped.increment(1);
            }
            return self.untrusted_max;
        }
        level
    }
}

/// The layer's metric handles, each labelled with its name.
struct CriticalityMetrics {
    malformed: Counter,
    capped: Counter,
}

impl MetricSet for CriticalityMetrics {
    fn register(name: &LayerName) -> Self {
        Self {
            malformed: metrics::counter!(metric_names::CRITICALITY_MALFORMED, NAME_LABEL => name.label()),
            capped: metrics::counter!(metric_names::CRITICALITY_CAPPED, NAME_LABEL => name.label()),
        }
    }
}

impl fmt::Debug for CriticalitySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriticalityLayer")
            .field("name", self.name())
            .field("default_level", &self.default_level)
            .field("untrusted_max", &self.untrusted_max)
            .field("trust", &self.trust)
            .finish()
    }
}
