//! The spike in virtual time, in process (`demo-client spike --simulate`): `demo-server`'s
//! application (its model and the middleware of `--stack full` or `--stack adaptive`, as
//! [`router`] builds them) called directly, under tokio's paused clock, one tier.
//!
//! Where it differs from the real run: nothing competes for the CPU, there are no
//! connections, and a request the client gave up on is still served to its end (the
//! binary's `--abandoned serve`), as each request runs in its own task. Three tiers are not
//! simulated: a tier's downstream call is real HTTP.

use std::net::SocketAddr;

use axum::body::Body;
use demo_server::model::{ArticleModel, LatencyModel, MmcModel, Model as ServerModel};
use http::{HeaderValue, Request};
use overload_signal::protocol::X_REQUEST_CRITICALITY;
use tower::{BoxError, ServiceExt};

use metrics_exporter_prometheus::PrometheusBuilder;

use super::figures::{RowFigures, handler_levels};
use super::{Awareness, RowSpec, SpikePlan, drive};
use crate::bench::outcome::{Attempt, Outcome};
use crate::bench::system::{Model, System};
use crate::experiment::ServerStack;
use crate::server::router;

/// Runs one single-tier row in a fresh single-threaded runtime with tokio's clock paused;
/// the M/M/c model's service times drawn from `seed`, so a seed gives the same figures.
/// Blocks for as long as the work takes (not the run's length).
///
/// # Errors
///
/// When the row has more than one tier or a stack other than full or adaptive, or the
/// runtime cannot be built.
pub fn simulate_row(
    model: Model,
    spec: RowSpec,
    plan: &SpikePlan,
    seed: u64,
) -> Result<RowFigures, BoxError> {
    if spec.tiers != 1 {
        return Err("the simulated spike has one tier".into());
    }
    let stack = match spec.system {
        System::Full => ServerStack::Full,
        System::Adaptive => ServerStack::Adaptive,
        other => return Err(format!("the spike runs full or adaptive, not {other}").into()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    // NOTE: a recorder of this thread's own, set before the router registers its counters:
    // the single-threaded runtime runs every task here, so the handler's count of levels
    // lands in it, as the real server's lands in its `/metrics`.
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    runtime.block_on(async {
        let latency = match model {
            Model::Mmc => LatencyModel::from(MmcModel::builder().seed(seed).build()?),
            Model::Article => LatencyModel::from(ArticleModel::default()),
        };
        let app = router(stack, ServerModel::new(latency))?;
        let timeout = plan.timeout_len();
        let samples = drive(plan, |level, scheduled| {
            let app = app.clone();
            async move {
                let mut request = Request::get("/api")
                    .body(Body::empty())
                    .expect("a valid request");
                // NOTE: the peer the real server's connection puts in every request: a
                // client on this host, as the real run's generator is.
                request
                    .extensions_mut()
                    .insert(SocketAddr::from(([127, 0, 0, 1], 40_000)));
                if spec.awareness == Awareness::Aware {
                    request.headers_mut().insert(
                        X_REQUEST_CRITICALITY,
                        HeaderValue::from_static(level.as_str()),
                    );
                }
                // NOTE: its own task, so the work goes on when the client stops waiting.
                let served = tokio::spawn(app.oneshot(request));
                match tokio::time::timeout_at(scheduled + timeout, served).await {
                    Ok(Ok(Ok(response))) => {
                        Attempt::Ended(Outcome::of_response(response.status(), response.headers()))
                    }
                    _ => Attempt::Ended(Outcome::Failed),
                }
            }
        })
        .await;
        let mut figures = RowFigures::of(spec, &samples, plan);
        figures.bottom_levels = handler_levels(&metrics.render());
        Ok(figures)
    })
}
