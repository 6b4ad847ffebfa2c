//! What the binary prints: the start-up line's model, and a status line once a second.

use std::time::Duration;

use demo_server::app::ServerStats;
use demo_server::model::{LatencyModel, Model};
use demo_server::server::ConnectionStats;
use metrics_exporter_prometheus::PrometheusHandle;
use overload_signal::AttemptHistogram;
use ratelimit_layer::AdaptiveLimitLayer;

/// The latency model and its settings, for the start-up line.
pub(crate) fn describe(latency: &LatencyModel) -> String {
    match latency {
        LatencyModel::Article(m) => format!(
            "article ({:?} up to {} inside, x{} per {} above, cap {:?})",
            m.base(),
            m.knee(),
            m.growth(),
            m.step(),
            m.max_delay()
        ),
        LatencyModel::Mmc(m) => format!(
            "mmc ({} workers, mean service {:?}, seed {})",
            m.workers(),
            m.mean_service(),
            m.seed()
        ),
        LatencyModel::Instant => "instant".to_owned(),
    }
}

/// Once a second: the article's status line plus the stack's counters. Also runs the
/// Prometheus recorder's upkeep, which the recorder needs when no exporter task runs it.
pub(crate) async fn status_lines(
    model: Model,
    stats: ServerStats,
    connections: ConnectionStats,
    histogram: Option<AttemptHistogram>,
    adaptive: Option<AdaptiveLimitLayer>,
    metrics: PrometheusHandle,
    quiet: bool,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut before = stats.snapshot();
    loop {
        ticker.tick().await;
        metrics.run_upkeep();
        metrics::gauge!(demo_server::server::metric_names::CONNECTIONS_OPEN)
            .set(connections.open() as f64);
        let now = stats.snapshot();
        let second = now.since(&before);
        before = now;
        if quiet {
            continue;
        }
        let retry_share = histogram
            .as_ref()
            .and_then(|h| h.snapshot().retry_share())
            .map_or_else(|| "-".to_owned(), |s| format!("{:.1}%", s * 100.0));
        println!(
            "concurrency: {}, last delay: {:?}, admitted: {}/s, rejected: {}/s, stop signals: {}/s, expired: {}/s, failed: {}/s, retry share (10 s): {}, connections: {}",
            model.concurrency(),
            model.last_delay(),
            second.served,
            second.rejected,
            second.stop_signals,
            second.expired,
            second.failed,
            retry_share,
            connections.open(),
        );
        if let Some(adaptive) = &adaptive {
            let a = adaptive.status();
            println!(
                "  adaptive limit: {}, in flight: {}, baseline: {:?}, latency: {:?}{}, capacity: {}",
                a.limit,
                a.in_flight,
                a.baseline.unwrap_or_default(),
                a.latency.unwrap_or_default(),
                if a.probing {
                    " (measuring the baseline)"
                } else {
                    ""
                },
                model.capacity().map_or(0, |c| c.get()),
            );
        }
    }
}
