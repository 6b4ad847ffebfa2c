use std::time::Duration;

use tokio::time::Instant;

use super::figures::{RowFigures, handler_levels};
use super::*;

const MS: fn(u64) -> Duration = Duration::from_millis;
const S: fn(u64) -> Duration = Duration::from_secs;

/// 20 req/s of capacity: 10 req/s critical for 3 s, 200 req/s sheddable for the last 1 s.
fn small_plan() -> SpikePlan {
    SpikePlan::new(20.0)
        .and_then(|p| p.warmup(S(2)))
        .and_then(|p| p.spike(S(1)))
        .unwrap()
        .spacing(Arrivals::Fixed)
}

#[test]
fn the_plan_has_the_issues_defaults_and_refuses_what_cannot_work() {
    let plan = SpikePlan::new(200.0).unwrap();
    assert_eq!((plan.steady(), plan.spike_rate()), (100.0, 2000.0));
    assert_eq!((plan.warmup_len(), plan.spike_len()), (S(10), S(30)));
    assert_eq!((plan.timeout_len(), plan.total()), (S(2), S(40)));
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = SpikePlan::new(bad).unwrap_err().to_string();
        assert!(err.starts_with("the capacity must be"), "{err}");
        assert!(plan.clone().steady_share(bad).is_err());
        assert!(plan.clone().spike_factor(bad).is_err());
    }
    assert_eq!(
        plan.clone().warmup(MS(1999)).unwrap_err().to_string(),
        "the warm-up must last at least 2s, got 1.999s"
    );
    assert!(plan.clone().spike(MS(999)).is_err());
    assert!(plan.clone().timeout(Duration::ZERO).is_err());
    assert!(plan.max_in_flight(0).is_err());
}

#[test]
fn the_arrivals_are_the_two_streams_at_their_rates_in_order() {
    let arrivals = small_plan().arrivals();
    let count = |level| arrivals.iter().filter(|(_, l)| *l == level).count();
    assert_eq!((count(STEADY_LEVEL), count(SPIKE_LEVEL)), (30, 200));
    assert!(arrivals.is_sorted_by_key(|(at, _)| *at));
    let first_spike = arrivals.iter().find(|(_, l)| *l == SPIKE_LEVEL).unwrap();
    assert_eq!(first_spike.0, S(2));
    let last_spike = arrivals
        .iter()
        .rev()
        .find(|(_, l)| *l == SPIKE_LEVEL)
        .unwrap();
    assert!(last_spike.0 < S(3));
    // The steady stream runs through the spike.
    assert!(
        arrivals
            .iter()
            .any(|(at, l)| *l == STEADY_LEVEL && *at >= S(2))
    );
}

/// A fake server in paused time: critical requests are served in 10 ms before the spike
/// and 30 ms during it; sheddable ones alternately served in 50 ms and rejected at once.
#[tokio::test(start_paused = true)]
async fn each_arrival_ends_in_a_sample_with_its_outcome_and_latency() {
    let plan = small_plan();
    let start = Instant::now();
    let mut sheddable = 0u32;
    let samples = drive(&plan, move |level, scheduled| {
        let during_spike = scheduled.duration_since(start) >= S(2);
        sheddable += u32::from(level == SPIKE_LEVEL);
        let (delay, outcome) = match level {
            STEADY_LEVEL if during_spike => (MS(30), Outcome::Served),
            STEADY_LEVEL => (MS(10), Outcome::Served),
            _ if sheddable % 2 == 0 => (MS(50), Outcome::Served),
            _ => (Duration::ZERO, Outcome::Rejected),
        };
        async move {
            tokio::time::sleep(delay).await;
            Attempt::Ended(outcome)
        }
    })
    .await;
    assert_eq!(samples.len(), 230);
    assert!(samples.iter().all(|s| s.outcome.is_some()));
    let spec = RowSpec {
        system: System::Full,
        tiers: 1,
        awareness: Awareness::Aware,
    };
    let row = RowFigures::of(spec, &samples, &plan);
    let [critical, sheddable] = &row.levels;
    // Critical: the 10 arrivals of the spike's second, all served in 30 ms; its unloaded
    // p99 from the 10 arrivals of the second second (the first left out), 10 ms.
    assert_eq!((critical.offered, critical.served), (10, 10));
    assert_eq!(critical.success_rate(), Some(1.0));
    assert_eq!(
        (critical.p99, critical.unloaded_p99),
        (Some(MS(30)), Some(MS(10)))
    );
    assert_eq!(critical.p99_ratio(), Some(3.0));
    // Sheddable: half served in 50 ms, half rejected; not sent before the spike.
    assert_eq!(
        (sheddable.offered, sheddable.served, sheddable.rejected),
        (200, 100, 100)
    );
    assert_eq!(sheddable.success_rate(), Some(0.5));
    assert_eq!(
        (sheddable.p99, sheddable.unloaded_p99),
        (Some(MS(50)), None)
    );
    // Served per scheduled second: 10 critical each second, 100 sheddable in the last.
    assert_eq!(row.served_per_second, vec![[10, 0], [10, 0], [10, 100]]);
}

#[tokio::test(start_paused = true)]
async fn arrivals_over_the_in_flight_cap_are_dropped_not_sent() {
    let plan = small_plan().max_in_flight(5).unwrap();
    let mut sent = 0;
    let samples = drive(&plan, |_, _| {
        sent += 1;
        async {
            tokio::time::sleep(S(60)).await;
            Attempt::Ended(Outcome::Failed)
        }
    })
    .await;
    // The first five hold the cap for a minute: every later arrival is dropped.
    assert_eq!(sent, 5);
    assert_eq!(samples.iter().filter(|s| s.outcome.is_none()).count(), 225);
    let spec = RowSpec {
        system: System::Adaptive,
        tiers: 3,
        awareness: Awareness::ClassBlind,
    };
    let row = RowFigures::of(spec, &samples, &plan);
    assert_eq!(row.levels[1].dropped, 200);
    assert_eq!(row.levels[1].success_rate(), Some(0.0));
    assert_eq!(row.levels[0].unloaded_p99, None, "nothing was served");
}

#[test]
fn the_handler_levels_are_read_from_the_metrics_text() {
    let text = "# TYPE demo_server_handler_criticality_total counter\n\
        demo_server_handler_criticality_total{criticality=\"sheddable\"} 12\n\
        demo_server_handler_criticality_total{criticality=\"critical\"} 30\n\
        demo_server_requests_total{outcome=\"served\"} 42\n";
    assert_eq!(handler_levels(text), Some([12, 0, 30, 0]));
    assert_eq!(
        handler_levels("demo_server_requests_total{outcome=\"served\"} 42\n"),
        None
    );
}

#[test]
fn the_rows_come_class_blind_then_aware_for_each_stack_and_topology() {
    let rows = RowSpec::all(&[System::Full, System::Adaptive], &[1, 3]);
    let labels: Vec<String> = rows.iter().map(RowSpec::label).collect();
    assert_eq!(
        labels,
        [
            "full, 1 tier, class-blind",
            "full, 1 tier, criticality-aware",
            "adaptive, 1 tier, class-blind",
            "adaptive, 1 tier, criticality-aware",
            "full, 3 tiers, class-blind",
            "full, 3 tiers, criticality-aware",
            "adaptive, 3 tiers, class-blind",
            "adaptive, 3 tiers, criticality-aware",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_table_csv_and_plot_hold_every_row_and_level() {
    let plan = small_plan();
    let samples = drive(&plan, |level, _| async move {
        tokio::time::sleep(MS(20)).await;
        Attempt::Ended(if level == STEADY_LEVEL {
            Outcome::Served
        } else {
            Outcome::Rejected
        })
    })
    .await;
    let rows: Vec<RowFigures> = RowSpec::all(&[System::Full], &[1, 3])
        .into_iter()
        .map(|spec| {
            let mut row = RowFigures::of(spec, &samples, &plan);
            if spec.tiers == 3 {
                row.bottom_levels = Some([0, 0, 40, 0]);
            }
            row
        })
        .collect();
    let markdown = table::markdown(&plan, &rows);
    assert!(
        markdown.contains(
            "| full, 1 tier, class-blind | critical | 100.00 % | 20 ms | 20 ms | 1.00x | 10 | 0 | 0 | 0 | not read |"
        ),
        "{markdown}"
    );
    assert!(
        markdown.contains(
            "| full, 3 tiers, criticality-aware | sheddable | 0.00 % | - | - | - | 200 | 200 | 0 | 0 | 0 / 0 / 40 / 0 |"
        ),
        "{markdown}"
    );
    let csv = table::csv(&rows);
    assert_eq!(csv.lines().count(), 1 + 4 * 2);
    assert!(csv.contains(
        "\"full, 3 tiers, class-blind\",full,3,class-blind,critical,10,10,0,0,0,0,1.0000,20.0,20.0,0,0,40,0"
    ));
    assert!(csv.contains(
        "\"full, 1 tier, class-blind\",full,1,class-blind,sheddable,200,0,200,0,0,0,0.0000,,,,,,"
    ));
    let timeline = table::timeline_csv(&rows);
    assert_eq!(timeline.lines().count(), 1 + 4 * 3);
    let svg = table::svg(&plan, &rows);
    assert!(svg.starts_with("<svg"));
    assert_eq!(
        svg.matches("criticality-aware").count(),
        2,
        "one panel a row"
    );
}

/// The simulated spike, in virtual time: the full stack's token bucket (183 req/s, burst 10)
/// in front of the M/M/10 model. Class-blind, the spike's 2 100 req/s (Poisson arrivals)
/// share the bucket's 183 by chance: about a twelfth of `critical` is served. The same seed
/// gives the same figures.
#[test]
fn the_simulated_class_blind_spike_sheds_critical_with_the_rest() {
    let plan = SpikePlan::new(200.0)
        .and_then(|p| p.warmup(S(3)))
        .and_then(|p| p.spike(S(5)))
        .unwrap();
    let spec = RowSpec {
        system: System::Full,
        tiers: 1,
        awareness: Awareness::ClassBlind,
    };
    let row = simulated::simulate_row(crate::bench::system::Model::Mmc, spec, &plan, 7).unwrap();
    let [critical, sheddable] = &row.levels;
    // Poisson arrivals: about 100 and 2 000 a second.
    assert!((450..550).contains(&critical.offered), "{row:?}");
    assert!((9_700..10_300).contains(&sheddable.offered), "{row:?}");
    let served = critical.served + sheddable.served;
    // 183 req/s for 5 s, the burst and a scheduling edge either side.
    assert!((900..=940).contains(&served), "{row:?}");
    let rate = critical.success_rate().unwrap();
    assert!(
        (0.05..0.15).contains(&rate),
        "critical success {rate}: {row:?}"
    );
    assert!(
        critical.unloaded_p99.is_some_and(|p| p < MS(400)),
        "{row:?}"
    );
    // Over the whole run, the one tier's handler ran every request served, each as
    // `critical` (class-blind: no level on the wire).
    let levels = row
        .bottom_levels
        .expect("the simulated tier's handler levels");
    let all_served: u64 = row.served_per_second.iter().flatten().sum();
    assert_eq!(levels, [0, 0, all_served, 0], "{row:?}");
    let again = simulated::simulate_row(crate::bench::system::Model::Mmc, spec, &plan, 7).unwrap();
    assert_eq!(again, row);
    let three = RowSpec { tiers: 3, ..spec };
    assert!(simulated::simulate_row(crate::bench::system::Model::Mmc, three, &plan, 7).is_err());
}
