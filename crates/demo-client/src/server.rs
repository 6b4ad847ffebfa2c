//! The demo server as the simulation runs it: `demo-server`'s application with the same
//! middleware as the binary.

use demo_server::app::{AppConfig, Stack, app, default_rate_limit};
use demo_server::model::Model;
use overload_core::clock::TokioWallClock;
use overload_signal::{DeadlineLayer, OverloadSignalLayer};
use ratelimit_layer::AdaptiveLimitLayer;
use ratelimit_layer::config::RateLimitConfig;
use tower::BoxError;

use crate::experiment::ServerStack;

/// `demo-server`'s router over `model`, with the middleware of `--stack full` (the overload
/// signal layer with its defaults, the deadline layer, the rate limiter at the binary's
/// default rate and burst for the model: 250 requests per second with bursts of 5 for the
/// article's), of `--stack adaptive` (the overload signal layer, the deadline layer and the
/// adaptive limit, all with their defaults), of `--stack deadline` (the deadline layer
/// alone) or of `--stack none` (nothing).
///
/// The deadline layer reads the time of day from a [`TokioWallClock`] made when this is
/// called, as the simulation's clients do: call it inside the simulation's runtime, so that
/// both follow its paused time.
///
/// # Errors
///
/// If the rate limit configuration is refused (it is a constant that the tests build).
pub fn router(stack: ServerStack, model: Model) -> Result<axum::Router, BoxError> {
    let stack = match stack {
        ServerStack::None => Stack::None,
        ServerStack::Deadline => Stack::Deadline,
        ServerStack::Full => {
            let (rate, burst) = default_rate_limit(model.latency());
            Stack::Full {
                overload: OverloadSignalLayer::default(),
                rate_limit: RateLimitConfig {
                    rate,
                    burst: Some(burst),
                    ..RateLimitConfig::default()
                }
                .layer()?
                .into(),
            }
        }
        ServerStack::Adaptive => Stack::Adaptive {
            overload: OverloadSignalLayer::default(),
            adaptive: AdaptiveLimitLayer::new(),
        },
    };
    let deadline = DeadlineLayer::builder()
        .wall_clock(TokioWallClock::new())
        .build()?;
    Ok(app(AppConfig::new(model).stack(stack).deadline(deadline)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use demo_server::model::LatencyModel;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn both_stacks_serve_the_api() {
        for stack in [
            ServerStack::None,
            ServerStack::Full,
            ServerStack::Adaptive,
            ServerStack::Deadline,
        ] {
            let model = Model::new(LatencyModel::default());
            let router = router(stack, model).unwrap();
            let response = router
                .oneshot(
                    http::Request::get("/api")
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{stack:?}");
        }
    }
}
