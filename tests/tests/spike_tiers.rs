//! Issue 33: a level set only at the client reaches the bottom of three chained
//! `demo-server` processes (`--stack full`, `--downstream`), through the libraries alone: no
//! handler copies `X-Request-Criticality` to its downstream call. Each tier's handler counts
//! the requests it ran by the level it ran in (`demo_server_handler_criticality_total`, from
//! the task's current level), and this test reads every tier's count.
//!
//! It passes only once the server stack resolves the level (the overload protection layer
//! puts it in the request and the task) and the retry layer carries the task's level on
//! the downstream call; before, every tier runs every request as `critical`, the default,
//! and the test fails naming the tiers that did not see `sheddable`.

use std::time::Duration;

use demo_client::bench::outcome::Outcome;
use demo_client::bench::send::HttpSender;
use demo_client::bench::system::{Model, System};
use demo_client::spike::tiers::Tiers;
use http::HeaderValue;
use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};

/// Ten `sheddable` requests and ten without a level, one at a time (far under every tier's
/// limit, so all are served); each tier must count exactly ten `sheddable` and ten
/// `critical` (the default of a request without a level). Bounded at 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bottom_tier_runs_in_the_level_the_client_sent() {
    let server = integration_tests::workspace_binary("demo-server");
    let tiers = Tiers::start(&server, System::Full, Model::Mmc, 3)
        .await
        .expect("three tiers start");
    let levels = tokio::time::timeout(Duration::from_secs(60), async {
        let plain = HttpSender::new(tiers.url(), Duration::from_secs(5));
        let sheddable = plain.clone().header(
            X_REQUEST_CRITICALITY,
            HeaderValue::from_static(Criticality::Sheddable.as_str()),
        );
        for sender in [&sheddable, &plain] {
            for _ in 0..10 {
                assert_eq!(
                    sender.send().await,
                    Outcome::Served,
                    "a lone request is served"
                );
            }
        }
        let mut levels = Vec::new();
        for tier in 0..tiers.len() {
            levels.push(
                tiers
                    .handler_levels(tier)
                    .await
                    .expect("each tier's /metrics"),
            );
        }
        levels
    })
    .await
    .expect("twenty requests within 60 s");
    tiers.shutdown().await;

    let rank = |level: Criticality| level.rank();
    let names = ["top", "middle", "bottom"];
    let wrong: Vec<String> = levels
        .iter()
        .zip(names)
        .filter(|(counts, _)| {
            counts[rank(Criticality::Sheddable)] != 10 || counts[rank(Criticality::Critical)] != 10
        })
        .map(|(counts, name)| {
            format!(
                "{name} tier ran sheddable {}, critical {}",
                counts[rank(Criticality::Sheddable)],
                counts[rank(Criticality::Critical)]
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "the client's level did not reach every tier (expected sheddable 10, critical 10 at \
         each; counts [sheddable, sheddable-plus, critical, critical-plus] top to bottom: \
         {levels:?}): {}",
        wrong.join("; ")
    );
}
