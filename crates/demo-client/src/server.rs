//! The demo server as the simulation runs it: `demo-server`'s application with the same
//! middleware as the binary.

use demo_server::app::{AppConfig, Stack, app};
use demo_server::model::Model;
use overload_signal::OverloadSignalLayer;
use ratelimit_layer::RateLimitConfig;
use tower::BoxError;

use crate::experiment::ServerStack;

/// The rate limit of `demo-server --stack full` with the article's model: 250 requests per
/// second with bursts of 5 (the binary's defaults for that model).
pub const ARTICLE_RATE_LIMIT: u32 = 250;
/// The token bucket burst of `demo-server --stack full` with the article's model: 5.
pub const ARTICLE_BURST: u32 = 5;

/// `demo-server`'s router over `model`, with the middleware of `--stack full` (the overload
/// signal layer with its defaults, the rate limiter at [`ARTICLE_RATE_LIMIT`] with bursts of
/// [`ARTICLE_BURST`]) or of `--stack none` (nothing).
///
/// # Errors
///
/// If the rate limit configuration is refused (it is a constant that the tests build).
pub fn router(stack: ServerStack, model: Model) -> Result<axum::Router, BoxError> {
    let stack = match stack {
        ServerStack::None => Stack::None,
        ServerStack::Full => Stack::Full {
            overload: OverloadSignalLayer::default(),
            rate_limit: RateLimitConfig {
                rate: ARTICLE_RATE_LIMIT,
                burst: Some(ARTICLE_BURST),
                ..RateLimitConfig::default()
            }
            .layer()?,
        },
    };
    Ok(app(AppConfig::new(model).stack(stack)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use demo_server::model::LatencyModel;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn both_stacks_serve_the_api() {
        for stack in [ServerStack::None, ServerStack::Full] {
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
