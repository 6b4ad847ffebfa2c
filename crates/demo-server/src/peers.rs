//! Other projects' overload protection in front of the same model, so a benchmark can put
//! them beside this workspace's stacks: `demo-server --stack tower-shed`, `tower-resilience`
//! or `little`.
//!
//! Each peer is used as its own documentation shows, with its defaults where it has them,
//! and sheds what it will not serve with `503 Service Unavailable` (body `overloaded\n`, no
//! `Retry-After`: none of the peers computes one), at once, without the model. The counts
//! of [`ServerStats`](crate::app::ServerStats) take those answers as rejections.
//!
//! | peer | what it is | its setting here |
//! |---|---|---|
//! | [`Peer::tower_shed`] | tower's `ConcurrencyLimit` inside `LoadShed`: a fixed concurrency, the rest shed | the concurrency it is given; the binary gives the model's capacity (the M/M/c workers, the article's knee) |
//! | [`Peer::tower_resilience`] | tower-resilience's `AdaptiveLimiterLayer` with its `Vegas` algorithm inside tower's `LoadShed` (the limiter waits for a permit; `LoadShed` turns that wait into a rejection) | Vegas's defaults: limit 10 at first, within 1..=100, alpha 3, beta 6 |
//! | [`Peer::little`] | little-loadshedder's `LoadShedLayer`: a queue sized by Little's law to keep the average latency at a target, and a concurrency it tunes for throughput | the target given; EWMA parameter [`LITTLE_EWMA`] |
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroUsize;
//! use demo_server::app::{AppConfig, Stack, app};
//! use demo_server::model::{LatencyModel, MmcModel, Model};
//! use demo_server::peers::Peer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mmc = MmcModel::builder().build()?;
//! let workers = mmc.workers();
//! let model = Model::new(LatencyModel::from(mmc));
//! // tower's ConcurrencyLimit + LoadShed at the model's 10 workers.
//! let router = app(AppConfig::new(model).stack(Stack::Peer(Peer::tower_shed(workers))));
//! # let _ = router;
//! # Ok(())
//! # }
//! ```

use std::convert::Infallible;
use std::fmt;
use std::num::NonZeroUsize;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tower::BoxError;

/// little-loadshedder's EWMA parameter here: 0.01, the value of the crate's own example
/// server (each response moves the average latency by 1 %; at 200 requests a second that is
/// a time constant of about half a second). The crate documents no default.
pub const LITTLE_EWMA: f64 = 0.01;

/// One of the peers a benchmark compares this workspace's stacks with; see the
/// [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    TowerShed { concurrency: NonZeroUsize },
    TowerResilience,
    Little { target: Duration },
}

impl Peer {
    /// tower's `ConcurrencyLimit` at `concurrency` inside `LoadShed`: at most
    /// `concurrency` requests in the model, the others answered `503` at once.
    pub const fn tower_shed(concurrency: NonZeroUsize) -> Self {
        Self {
            kind: Kind::TowerShed { concurrency },
        }
    }

    /// tower-resilience's adaptive limiter with the `Vegas` algorithm and its defaults
    /// (a limit of 10 at first, within 1..=100, alpha 3, beta 6) inside tower's `LoadShed`.
    ///
    /// Vegas rather than AIMD because tower-resilience's docs say of it that it "is more
    /// stable than AIMD and avoids the sawtooth pattern", and because its AIMD needs a
    /// latency threshold, a figure the user must know beforehand, which Vegas finds from the
    /// smallest latency it sees.
    pub const fn tower_resilience() -> Self {
        Self {
            kind: Kind::TowerResilience,
        }
    }

    /// little-loadshedder's Little's-law shedder keeping the average latency at `target`,
    /// with the EWMA parameter [`LITTLE_EWMA`].
    ///
    /// # Errors
    ///
    /// [`InvalidPeer`] when `target` is zero.
    pub fn little(target: Duration) -> Result<Self, InvalidPeer> {
        if target.is_zero() {
            return Err(InvalidPeer(format!(
                "little's target latency must be above zero, got {target:?}"
            )));
        }
        Ok(Self {
            kind: Kind::Little { target },
        })
    }

    /// The name `demo-server --stack` takes for this peer: `tower-shed`,
    /// `tower-resilience` or `little`.
    pub const fn name(&self) -> &'static str {
        match self.kind {
            Kind::TowerShed { .. } => "tower-shed",
            Kind::TowerResilience => "tower-resilience",
            Kind::Little { .. } => "little",
        }
    }

    /// Wraps the `/api` route (`route`) in this peer. Its rejections are tower's
    /// `Overloaded` errors, which [`handle_shed`] answers (`little` answers them itself).
    pub(crate) fn wrap<S>(&self, route: S) -> PeerService
    where
        S: tower::Service<
                axum::extract::Request,
                Response = Response,
                Error = Infallible,
                Future: Send + 'static,
            > + Clone
            + Send
            + Sync
            + 'static,
    {
        use tower::{Layer, ServiceExt};
        match self.kind {
            Kind::TowerShed { concurrency } => tower::util::BoxCloneSyncService::new(
                (
                    tower::load_shed::LoadShedLayer::new(),
                    tower::limit::ConcurrencyLimitLayer::new(concurrency.get()),
                )
                    .layer(route),
            ),
            Kind::TowerResilience => tower::util::BoxCloneSyncService::new(
                (
                    tower::load_shed::LoadShedLayer::new(),
                    tower_resilience::adaptive::AdaptiveLimiterLayer::new(
                        tower_resilience::adaptive::Vegas::builder()
                            .build()
                            .expect("tower-resilience's default Vegas is valid"),
                    ),
                )
                    .layer(route),
            ),
            Kind::Little { target } => tower::util::BoxCloneSyncService::new(
                little_loadshedder::LoadShedLayer::new(LITTLE_EWMA, target)
                    .layer(route)
                    .map_response(|response| match response {
                        little_loadshedder::LoadShedResponse::Inner(response) => response,
                        little_loadshedder::LoadShedResponse::Overload => shed_response(),
                    })
                    .map_err(|never| match never {}),
            ),
        }
    }
}

/// The `/api` route wrapped in a peer.
pub(crate) type PeerService =
    tower::util::BoxCloneSyncService<axum::extract::Request, Response, BoxError>;

/// Marks (as a response extension, never on the wire) a `503` that a peer answered when it
/// shed the request, so [`ServerStats`](crate::app::ServerStats) counts it as a rejection
/// and not as a failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shed;

fn shed_response() -> Response {
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, "overloaded\n").into_response();
    response.extensions_mut().insert(Shed);
    response
}

/// The answer to a peer's error, for axum's `HandleErrorLayer`: `503` marked [`Shed`] for
/// tower's `Overloaded`, `500` for anything else.
// NOTE: tower's `LoadShed` is the only source of errors below it (the route is
// `Infallible`, tower-resilience's limiter fails only when its semaphore is closed, which it
// never closes); anything else is still answered, never a dropped connection.
// axum's error handlers are async.
#[allow(clippy::unused_async)]
pub(crate) async fn handle_shed(e: BoxError) -> Response {
    if e.is::<tower::load_shed::error::Overloaded>() {
        shed_response()
    } else {
        tracing::warn!(error = %e, "a peer failed");
        (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
    }
}

/// A peer's setting that cannot work; the message names it, its value and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidPeer(String);

impl fmt::Display for InvalidPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidPeer {}
