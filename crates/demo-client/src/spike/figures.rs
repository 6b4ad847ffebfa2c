//! The figures of a spike row: per level, what its requests became during the spike, and
//! the served rate per second for the plot.

use std::time::Duration;

use overload_signal::protocol::Criticality;

use super::{RowSpec, SPIKE_LEVEL, STEADY_LEVEL, Sample, SpikePlan, UNLOADED_SKIP};
use crate::bench::open_loop::LATE_AFTER;
use crate::bench::outcome::Outcome;
use crate::report::percentile;

/// One level's figures in one row.
#[derive(Clone, Debug, PartialEq)]
pub struct LevelFigures {
    /// The level.
    pub level: Criticality,
    /// Arrivals of the level scheduled during the spike.
    pub offered: u64,
    /// Of those, served (`2xx`).
    pub served: u64,
    /// Rejected (`429`, `503`, the stop signal).
    pub rejected: u64,
    /// Failed (timeouts, connection errors, other statuses).
    pub failed: u64,
    /// Not sent by the generator (its in-flight cap, or no descriptor or port left).
    pub dropped: u64,
    /// Sent more than [`LATE_AFTER`] (5 ms) after their scheduled instant: the generator
    /// fell behind (their latency still counts from the schedule).
    pub late: u64,
    /// The p99 of the served requests' latency during the spike, from their scheduled
    /// instants; `None` when none was served.
    pub p99: Option<Duration>,
    /// The p99 of the served requests' latency before the spike (the warm-up's, its first
    /// second left out); `None` for a level not sent before the spike (`sheddable`).
    pub unloaded_p99: Option<Duration>,
}

impl LevelFigures {
    /// The figures of `level` among `samples`, as `plan` splits the run.
    pub fn of(level: Criticality, samples: &[Sample], plan: &SpikePlan) -> Self {
        let spike = plan.warmup_len()..plan.total();
        let mut figures = LevelFigures {
            level,
            offered: 0,
            served: 0,
            rejected: 0,
            failed: 0,
            dropped: 0,
            late: 0,
            p99: None,
            unloaded_p99: None,
        };
        let mut served = Vec::new();
        let mut unloaded = Vec::new();
        for sample in samples.iter().filter(|s| s.level == level) {
            if (UNLOADED_SKIP..plan.warmup_len()).contains(&sample.offset)
                && sample.outcome == Some(Outcome::Served)
            {
                unloaded.push(sample.latency);
            }
            if !spike.contains(&sample.offset) {
                continue;
            }
            figures.offered += 1;
            if sample.lag > LATE_AFTER {
                figures.late += 1;
            }
            match sample.outcome {
                Some(Outcome::Served) => {
                    figures.served += 1;
                    served.push(sample.latency);
                }
                Some(Outcome::Rejected) => figures.rejected += 1,
                Some(Outcome::Failed) => figures.failed += 1,
                None => figures.dropped += 1,
            }
        }
        served.sort_unstable();
        unloaded.sort_unstable();
        figures.p99 = percentile(&served, 0.99);
        figures.unloaded_p99 = percentile(&unloaded, 0.99);
        figures
    }

    /// Served over offered during the spike, `0..=1`; `None` when nothing was offered.
    pub fn success_rate(&self) -> Option<f64> {
        (self.offered > 0).then(|| self.served as f64 / self.offered as f64)
    }

    /// The spike's p99 over the unloaded one; `None` when either is missing.
    pub fn p99_ratio(&self) -> Option<f64> {
        let (spike, unloaded) = (self.p99?, self.unloaded_p99?);
        (!unloaded.is_zero()).then(|| spike.as_secs_f64() / unloaded.as_secs_f64())
    }
}

/// A row's figures: its spec, the two levels' figures, the served requests per second of
/// each level (by scheduled second), and, with tiers, what the bottom tier's handler saw.
#[derive(Clone, Debug, PartialEq)]
pub struct RowFigures {
    /// The row.
    pub spec: RowSpec,
    /// `critical` (the steady traffic), then `sheddable` (the spike).
    pub levels: [LevelFigures; 2],
    /// Per second of the run: served `critical` and served `sheddable` requests, by the
    /// second they were scheduled in.
    pub served_per_second: Vec<[u64; 2]>,
    /// The bottom tier's count of `/api` requests by the level its handler ran in, indexed
    /// by [`Criticality::rank`]; `None` when it could not be read.
    pub bottom_levels: Option<[u64; 4]>,
}

impl RowFigures {
    /// The figures of `samples`, one row's run of `plan`.
    pub fn of(spec: RowSpec, samples: &[Sample], plan: &SpikePlan) -> Self {
        let seconds = plan.total().as_secs_f64().ceil() as usize;
        let mut served_per_second = vec![[0; 2]; seconds.max(1)];
        for sample in samples {
            if sample.outcome != Some(Outcome::Served) {
                continue;
            }
            let second = (sample.offset.as_secs() as usize).min(served_per_second.len() - 1);
            let stream = usize::from(sample.level != STEADY_LEVEL);
            served_per_second[second][stream] += 1;
        }
        RowFigures {
            spec,
            levels: [
                LevelFigures::of(STEADY_LEVEL, samples, plan),
                LevelFigures::of(SPIKE_LEVEL, samples, plan),
            ],
            served_per_second,
            bottom_levels: None,
        }
    }

    /// The figures of `level`, if it is one of the row's two.
    pub fn level(&self, level: Criticality) -> Option<&LevelFigures> {
        self.levels.iter().find(|f| f.level == level)
    }
}

/// Reads [`HANDLER_CRITICALITY`](demo_server::app::metric_names::HANDLER_CRITICALITY) from
/// a `/metrics` text: the count per level, indexed by [`Criticality::rank`] (a level
/// absent from the text counts 0); `None` when no line of the counter is there.
pub fn handler_levels(metrics: &str) -> Option<[u64; 4]> {
    let name = demo_server::app::metric_names::HANDLER_CRITICALITY;
    let mut counts = [0u64; 4];
    let mut found = false;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Some(level) = labels
            .strip_prefix("{criticality=\"")
            .and_then(|l| l.strip_suffix("\"}"))
            .and_then(|l| Criticality::parse(l.as_bytes()))
        else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        counts[level.rank()] = value as u64;
        found = true;
    }
    found.then_some(counts)
}
