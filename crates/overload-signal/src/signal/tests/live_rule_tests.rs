//! The stop rule changed while serving (`OverloadSignalLayer::set_rule`): the next rejection
//! is judged by the new rule, every clone and service sees it, and the window is kept.

use super::*;
use crate::test_logs::LogCapture;

/// Sends `n` requests, a quarter of them retries, all rejected; counts the stop signals.
async fn storm<S>(svc: &mut S, n: usize) -> usize
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let mut stops = 0;
    for i in 0..n {
        let attempt = if i % 4 == 0 { 1 } else { 0 };
        let r = one(svc, request(Some(attempt))).await;
        stops += usize::from(protocol::is_stop_signal(r.headers()));
    }
    stops
}

#[tokio::test(start_paused = true)]
async fn a_new_threshold_judges_the_next_rejection_and_keeps_the_window() {
    let logs = Arc::new(LogCapture::default());
    let _logs = tracing::subscriber::set_default(Arc::clone(&logs));
    // Threshold 10 %: a storm with 25 % retries is told to stop once 20 requests are in.
    let layer = layer_with(rule(0.1, 20));
    let handle = layer.clone();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    assert_eq!(storm(&mut svc, 40).await, 21);

    // Raised above the storm's pressure (its retries and the retries its stop signals held
    // back, about two thirds), through a clone: the very next rejection is plain.
    let raised = handle.rule().to_builder().retry_share(0.9).build().unwrap();
    handle.set_rule(raised);
    assert_eq!(layer.rule(), rule(0.9, 20));
    assert_eq!(svc.rule(), raised);
    assert_eq!(
        layer.rule().min_requests(),
        20,
        "the other settings are kept"
    );
    assert_eq!(storm(&mut svc, 8).await, 0);

    // Lowered again: the window was kept (48 requests, 12 retries and the retries the stop
    // signals held back), so the signal is back at once, with no new warm-up of 20 requests.
    handle.set_rule(rule(0.1, 20));
    assert_eq!(storm(&mut svc, 1).await, 1);

    // A higher minimum than the window holds: plain again, from the next rejection.
    handle.set_rule(rule(0.1, 10_000));
    assert_eq!(storm(&mut svc, 4).await, 0);

    let changes = logs.with_message("stop rule changed");
    assert_eq!(changes.len(), 3, "{changes:?}");
    assert_eq!(changes[0].level, tracing::Level::INFO);
    assert_eq!(changes[0].field("old.retry_share"), Some("0.1"));
    assert_eq!(changes[0].field("retry_share"), Some("0.9"));
    assert_eq!(changes[2].field("min_requests"), Some("10000"));
}

#[tokio::test(start_paused = true)]
async fn setting_the_rule_in_force_logs_nothing() {
    let logs = Arc::new(LogCapture::default());
    let _logs = tracing::subscriber::set_default(Arc::clone(&logs));
    let layer = layer_with(rule(0.1, 20));
    layer.set_rule(rule(0.1, 20));
    assert!(logs.with_message("stop rule changed").is_empty());
    assert_eq!(layer.rule(), rule(0.1, 20));
}
