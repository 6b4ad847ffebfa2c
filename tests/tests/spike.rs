//! `demo-client spike`'s plumbing against real `demo-server` child processes on 127.0.0.1:
//! small rates (evenly spaced, so the counts are exact) and a few seconds, through the same code as the command (`run_row`), and the
//! table, CSVs and plot it writes.
//!
//! The server binary is built by `cargo build --workspace --bin demo-server` from this test
//! (a test cannot depend on another package's binary).

use std::time::Duration;

use demo_client::bench::open_loop::Arrivals;
use demo_client::bench::system::{Model, System};
use demo_client::spike::figures::RowFigures;
use demo_client::spike::tiers::run_row;
use demo_client::spike::{Awareness, RowSpec, SpikePlan, table};

/// Issue 33: three rows of 4 s against the M/M/10 model's full stack (183 req/s): 50 req/s
/// `critical` throughout, a `sheddable` spike of 200 req/s for the last 2 s. Every arrival of
/// the spike is accounted for, per level; the warm-up gives an unloaded p99 within the
/// timeout; the class-blind row's 250 req/s over a 183 req/s limit is shed in part; the
/// three-tier row reads the bottom tier's handler levels; the table, CSVs and plot hold
/// every row. The whole test is bounded at 90 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_short_rows_give_every_figure_of_both_levels() {
    let server = integration_tests::workspace_binary("demo-server");
    let plan = SpikePlan::new(Model::Mmc.capacity())
        .and_then(|p| p.steady_share(0.25))
        .and_then(|p| p.spike_factor(1.0))
        .and_then(|p| p.warmup(Duration::from_secs(2)))
        .and_then(|p| p.spike(Duration::from_secs(2)))
        .unwrap()
        .spacing(Arrivals::Fixed);
    let specs = [
        (1, Awareness::ClassBlind),
        (1, Awareness::Aware),
        (3, Awareness::Aware),
    ]
    .map(|(tiers, awareness)| RowSpec {
        system: System::Full,
        tiers,
        awareness,
    });
    let rows: Vec<RowFigures> = tokio::time::timeout(Duration::from_secs(90), async {
        let mut rows = Vec::new();
        for spec in specs {
            rows.push(run_row(&server, Model::Mmc, spec, &plan).await.unwrap());
        }
        rows
    })
    .await
    .expect("three rows of 4 s within 90 s");

    for row in &rows {
        let [critical, sheddable] = &row.levels;
        // 50 req/s and 200 req/s for the 2 s of the spike.
        assert_eq!((critical.offered, sheddable.offered), (100, 400), "{row:?}");
        for f in &row.levels {
            assert_eq!(
                f.served + f.rejected + f.failed + f.dropped,
                f.offered,
                "{row:?}"
            );
        }
        let unloaded = critical
            .unloaded_p99
            .expect("critical served in the warm-up");
        assert!(
            unloaded > Duration::ZERO && unloaded <= plan.timeout_len(),
            "{row:?}"
        );
        assert_eq!(
            sheddable.unloaded_p99, None,
            "no sheddable before the spike"
        );
        assert!(critical.served > 0 && sheddable.served > 0, "{row:?}");
        assert_eq!(row.served_per_second.len(), 4);
    }
    let blind = &rows[0];
    assert!(
        blind.levels[0].rejected + blind.levels[1].rejected > 0,
        "250 req/s over a limit of 183 req/s sheds some: {blind:?}"
    );
    assert_eq!(
        rows[0].bottom_levels.map(|b| b.iter().sum::<u64>() > 0),
        Some(true)
    );
    let bottom = rows[2]
        .bottom_levels
        .expect("the bottom tier's /metrics is read");
    assert!(
        bottom.iter().sum::<u64>() > 0,
        "the bottom tier ran requests: {bottom:?}"
    );

    let markdown = table::markdown(&plan, &rows);
    for spec in specs {
        for level in ["critical", "sheddable"] {
            let start = format!("| {} | {level} |", spec.label());
            assert!(markdown.contains(&start), "{start} missing in\n{markdown}");
        }
    }
    assert_eq!(table::csv(&rows).lines().count(), 1 + 3 * 2);
    assert_eq!(table::timeline_csv(&rows).lines().count(), 1 + 3 * 4);
    let svg = table::svg(&plan, &rows);
    assert_eq!(
        svg.matches("sheddable spike").count(),
        3,
        "a shaded spike per panel"
    );
    println!("{markdown}");
}
