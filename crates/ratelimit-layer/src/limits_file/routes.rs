//! What a [`LimitsLayer`](super::LimitsLayer) and its services share: the routing table in
//! force (one rate limit per entry of the file) and how a new file changes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use http::Request;
use overload_core::ConfigError;
use overload_core::clock::TokioClock;
use overload_core::telemetry::LayerName;

use super::limits::{EntryId, EntryLimit, Limits};
use super::watch::LimitsWatcher;
use crate::algorithm::{LiveTokenBucket, TokenBucketHandle};
use crate::config::KeyBy;
use crate::key::ClientIp;
use crate::rate_limit::RateLimitLayer;

/// What every clone of a layer and its services share: the table, and the watcher that
/// keeps it true to the file (stopped when the last of them goes).
pub(super) struct LimitsState {
    pub(super) table: Arc<LimitsTable>,
    pub(super) watcher: Option<LimitsWatcher>,
}

/// The routing table in force and what builds an entry.
pub(super) struct LimitsTable {
    pub(super) entries: LimitsEntrySettings,
    pub(super) routes: ArcSwap<LimitsRoutes>,
    /// Serializes [`apply`](Self::apply) (never a request).
    apply: Mutex<()>,
}

/// The limits in force and the layer of each entry.
pub(super) struct LimitsRoutes {
    pub(super) limits: Limits,
    default: LimitsEntry,
    exact: HashMap<String, LimitsEntry>,
    prefix: HashMap<String, LimitsEntry>,
    tenant: HashMap<String, LimitsEntry>,
}

/// One entry's layer, and the handle that changes its bucket.
#[derive(Clone)]
pub(super) struct LimitsEntry {
    pub(super) layer: RateLimitLayer,
    handle: TokenBucketHandle,
    key: KeyBy,
}

impl LimitsRoutes {
    fn get(&self, id: EntryId<'_>) -> Option<&LimitsEntry> {
        match id {
            EntryId::Default => Some(&self.default),
            EntryId::Exact(path) => self.exact.get(path),
            EntryId::Prefix(prefix) => self.prefix.get(prefix),
            EntryId::Tenant(tenant) => self.tenant.get(tenant),
        }
    }

    /// The entry whose limit `request` takes.
    #[inline]
    pub(super) fn entry_for<B>(&self, request: &Request<B>) -> &LimitsEntry {
        let tenant = self
            .limits
            .tenant_header()
            .and_then(|name| request.headers().get(name))
            .and_then(|value| value.to_str().ok());
        let (id, _) = self.limits.entry_for(request.uri().path(), tenant);
        // NOTE: every entry of `limits` has its layer, built together; the default is the
        // fallback that never happens.
        self.get(id).unwrap_or(&self.default)
    }
}

/// What every entry's layer is built with.
pub(super) struct LimitsEntrySettings {
    pub(super) name: LayerName,
    pub(super) client_ip: ClientIp,
    pub(super) admitted_headers: bool,
    /// One clock for every entry's bucket and layer: a change takes effect at its `now`.
    pub(super) clock: TokioClock,
}

impl LimitsEntrySettings {
    /// A new layer for `limit`.
    fn entry(&self, limit: &EntryLimit) -> Result<LimitsEntry, ConfigError> {
        let (bucket, handle) = LiveTokenBucket::new(limit.bucket.clone(), self.clock);
        let builder = RateLimitLayer::builder(bucket)
            .clock(self.clock)
            .name(self.name.as_str())
            .admitted_headers(self.admitted_headers);
        let layer = match limit.key {
            KeyBy::Global => builder.build()?,
            KeyBy::Ip => builder.key_by_client_ip(self.client_ip.clone()).build()?,
        };
        Ok(LimitsEntry {
            layer,
            handle,
            key: limit.key,
        })
    }

    /// The entries of `limits`: those of `old` kept (their buckets set to the new
    /// parameters), the others new.
    fn routes(
        &self,
        limits: &Limits,
        old: Option<&LimitsRoutes>,
    ) -> Result<LimitsRoutes, ConfigError> {
        let entry = |id: EntryId<'_>, limit: &EntryLimit| match old.and_then(|o| o.get(id)) {
            Some(kept) if kept.key == limit.key => {
                kept.handle.set(limit.bucket.clone());
                Ok::<_, ConfigError>(kept.clone())
            }
            _ => self.entry(limit),
        };
        let (_, default) = limits.entry_for("", None);
        let mut routes = LimitsRoutes {
            limits: limits.clone(),
            default: entry(EntryId::Default, default)?,
            exact: HashMap::new(),
            prefix: HashMap::new(),
            tenant: HashMap::new(),
        };
        for (id, limit) in limits.entries() {
            let (map, name) = match id {
                EntryId::Default => continue,
                EntryId::Exact(p) => (&mut routes.exact, p),
                EntryId::Prefix(p) => (&mut routes.prefix, p),
                EntryId::Tenant(t) => (&mut routes.tenant, t),
            };
            map.insert(name.to_owned(), entry(id, limit)?);
        }
        Ok(routes)
    }
}

impl LimitsTable {
    /// A table with `limits` in force, each entry built with `entries`.
    pub(super) fn new(entries: LimitsEntrySettings, limits: &Limits) -> Result<Self, ConfigError> {
        let routes = entries.routes(limits, None)?;
        Ok(Self {
            entries,
            routes: ArcSwap::from_pointee(routes),
            apply: Mutex::new(()),
        })
    }

    pub(super) fn apply(&self, limits: &Limits) -> Result<(), ConfigError> {
        let _apply = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.routes.load_full();
        let routes = self.entries.routes(limits, Some(&old))?;
        self.routes.store(Arc::new(routes));
        Ok(())
    }
}
