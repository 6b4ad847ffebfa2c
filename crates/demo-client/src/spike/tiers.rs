//! The servers of a spike row: one `demo-server`, or three chained with `--downstream`, each
//! started fresh on a free port of 127.0.0.1; and the run of one row against them.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use http::{HeaderValue, Uri};
use overload_signal::protocol::X_REQUEST_CRITICALITY;
use tower::BoxError;

use super::figures::{RowFigures, handler_levels};
use super::{Awareness, RowSpec, SPIKE_LEVEL, STEADY_LEVEL, SpikePlan, drive};
use crate::bench::send::HttpSender;
use crate::bench::system::{Model, System, server_args};
use crate::process::{ServerProcess, http_get_text};

/// `demo-server` processes chained: the client calls the first (the top tier), each calls
/// the next before answering, the last (the bottom tier) calls nothing. Killed when
/// dropped.
#[derive(Debug)]
pub struct Tiers {
    /// Top first.
    servers: Vec<ServerProcess>,
}

impl Tiers {
    /// Starts `tiers` (at least one) `demo-server` processes of `system` on `model`, bottom
    /// first, each above calling the one below with `--downstream`; each ready before the
    /// next starts. The arguments are the benchmark's ([`server_args`]: `--abandoned
    /// serve`); no handler copies the level from its request to its downstream call, so
    /// the level reaches a lower tier only through the libraries.
    ///
    /// # Errors
    ///
    /// When `tiers` is zero, `system` is neither [`System::Full`] nor [`System::Adaptive`],
    /// or a server cannot start.
    pub async fn start(
        program: &Path,
        system: System,
        model: Model,
        tiers: usize,
    ) -> Result<Self, BoxError> {
        if tiers == 0 {
            return Err("a spike needs at least one tier".into());
        }
        if !matches!(system, System::Full | System::Adaptive) {
            return Err(format!("the spike runs full or adaptive servers, not {system}").into());
        }
        let mut servers: Vec<ServerProcess> = Vec::with_capacity(tiers);
        for tier in (0..tiers).rev() {
            let mut args = server_args(system, model);
            if let Some(below) = servers.last() {
                args.push(OsString::from("--downstream"));
                args.push(OsString::from(format!("http://{}/api", below.addr())));
            }
            let server = ServerProcess::start(program, &args, None)
                .await
                .map_err(|e| format!("tier {} of {tiers} ({system} on {model}): {e}", tier + 1))?;
            servers.push(server);
        }
        servers.reverse();
        Ok(Self { servers })
    }

    /// The top tier's `/api`, where the load goes.
    pub fn url(&self) -> Uri {
        format!("http://{}/api", self.servers[0].addr())
            .parse()
            .expect("an address makes a URL")
    }

    /// How many tiers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Never: there is at least one tier.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The count of `/api` requests by the level the handler ran in, at tier `index` (0 the
    /// top), from its `/metrics`, indexed by
    /// [`Criticality::rank`](overload_signal::protocol::Criticality::rank).
    ///
    /// # Errors
    ///
    /// When there is no such tier, its `/metrics` does not answer within 5 s, or it has no
    /// line of the counter.
    pub async fn handler_levels(&self, index: usize) -> Result<[u64; 4], BoxError> {
        let server = self.servers.get(index).ok_or("no such tier")?;
        let url: Uri = format!("http://{}/metrics", server.addr()).parse()?;
        let text = http_get_text(url, Duration::from_secs(5)).await?;
        handler_levels(&text)
            .ok_or_else(|| format!("tier {index}'s /metrics has no handler level counter").into())
    }

    /// The count at the bottom tier.
    ///
    /// # Errors
    ///
    /// As [`Tiers::handler_levels`].
    pub async fn bottom_levels(&self) -> Result<[u64; 4], BoxError> {
        self.handler_levels(self.servers.len() - 1).await
    }

    /// Stops every tier.
    pub async fn shutdown(self) {
        for server in self.servers {
            let _ = server.shutdown().await;
        }
    }
}

/// Runs one row: starts its tiers fresh, sends `plan`'s load to the top tier (each request
/// with its level in `X-Request-Criticality` when the row is aware), reads the bottom
/// tier's handler levels, stops the tiers.
///
/// # Errors
///
/// When a server cannot start.
pub async fn run_row(
    program: &Path,
    model: Model,
    spec: RowSpec,
    plan: &SpikePlan,
) -> Result<RowFigures, BoxError> {
    let tiers = Tiers::start(program, spec.system, model, spec.tiers).await?;
    let sender = |level: overload_signal::protocol::Criticality| {
        let sender = HttpSender::new(tiers.url(), plan.timeout_len());
        match spec.awareness {
            Awareness::ClassBlind => sender,
            Awareness::Aware => sender.header(
                X_REQUEST_CRITICALITY,
                HeaderValue::from_static(level.as_str()),
            ),
        }
    };
    let (steady, spike) = (sender(STEADY_LEVEL), sender(SPIKE_LEVEL));
    let samples = drive(plan, |level, scheduled| {
        if level == STEADY_LEVEL {
            steady.send_scheduled(scheduled)
        } else {
            spike.send_scheduled(scheduled)
        }
    })
    .await;
    let mut figures = RowFigures::of(spec, &samples, plan);
    figures.bottom_levels = tiers.bottom_levels().await.ok();
    tiers.shutdown().await;
    Ok(figures)
}
