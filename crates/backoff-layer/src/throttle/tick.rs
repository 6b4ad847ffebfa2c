//! [`TickState`]: what the tick keeps for every slot of the table (each slot's window, how
//! long it has been idle, its name, its gauge, when its throttling began), and the work of
//! one tick.
//!
//! Only the tick reads or writes it, one tick at a time (it sits behind the throttle's tick
//! lock, which no request takes), so it needs no atomics.
//!
//! **Bounded series.** A recorder keeps every series it was given, and destinations may be
//! chosen by a client's users: the first `max_labelled` destinations throttled get a gauge
//! series of their own, for the life of the throttle; every later one is reported in one
//! shared series, `(other)`, set to the highest probability among them.

use std::collections::HashSet;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use metrics::Gauge;
use overload_core::telemetry::LayerName;

use crate::throttle::rule::{SentCounts, ThrottleRule, from_units, split};
use crate::throttle::table::{DestinationTable, LEVELS};
use crate::throttle::telemetry::{
    OTHER_DESTINATIONS, probability_gauge, throttling_began, throttling_ended,
};

/// A destination's name, sent by the request that claimed its slot: `(slot, key, name)`.
pub(crate) type ClaimedLabel = (usize, u64, Box<str>);

/// Whether the tick logs and sets gauges. Not under loom, whose models never tick.
const TELEMETRY: bool = !cfg!(loom);

/// One closed slot of a destination's window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SlotCounts {
    accepts: u32,
    failures: u32,
}

impl SlotCounts {
    fn of(counts: SentCounts) -> Self {
        let narrow = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        Self {
            accepts: narrow(counts.accepts),
            failures: narrow(counts.failures),
        }
    }

    fn counts(self) -> SentCounts {
        SentCounts {
            accepts: u64::from(self.accepts),
            failures: u64::from(self.failures),
        }
    }
}

/// Where a destination's probability is reported.
#[derive(Default)]
enum Series {
    /// Not decided yet: the destination has not been throttled.
    #[default]
    Undecided,
    /// A series of its own.
    Own(Gauge),
    /// The shared series, `(other)`.
    Other,
}

/// What one slot of the table is, as the tick knows it.
#[derive(Default)]
struct SlotView {
    /// The destination the rest describes (0: none yet).
    key: u64,
    /// Ticks without a request.
    idle: u64,
    name: Option<Box<str>>,
    series: Series,
    /// When the current throttling began, in the clock's nanoseconds.
    throttling_since: Option<u64>,
    /// Requests by level (attempts sent and requests refused) in the newest slot of time
    /// that had any: how the destination's probability is shared among the levels.
    mix: [u64; LEVELS],
}

/// The tick's state; see the [module docs](self).
pub(crate) struct TickState {
    /// The slot number (clock nanoseconds over the slot width) of the last tick.
    last_slot: u64,
    slots: usize,
    slot_nanos: u64,
    /// Ticks without a request after which a destination's slot is released.
    idle_ticks: u64,
    /// `slots` closed slots per table slot, by slot number modulo `slots`.
    ring: Vec<SlotCounts>,
    views: Vec<SlotView>,
    names: Receiver<ClaimedLabel>,
    /// The names of the destinations with a series of their own: at most `max_labelled`.
    labelled: HashSet<Box<str>>,
    max_labelled: usize,
    /// The series of every other destination, registered when the first is throttled.
    other: Option<Gauge>,
}

/// What one tick did, for the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TickReport {
    /// Slots whose window was updated.
    pub(crate) updated: usize,
    /// Slots released for being idle.
    pub(crate) released: usize,
}

impl TickState {
    /// The state of a table with `capacity` slots whose windows have `slots` slots of
    /// `slot_nanos` each, starting at `now`.
    pub(crate) fn new(
        capacity: usize,
        slots: usize,
        slot_nanos: u64,
        idle_ticks: u64,
        max_labelled: usize,
        now: u64,
        names: Receiver<ClaimedLabel>,
    ) -> Self {
        Self {
            last_slot: now / slot_nanos,
            slots,
            slot_nanos,
            idle_ticks,
            ring: vec![SlotCounts::default(); capacity * slots],
            views: (0..capacity).map(|_| SlotView::default()).collect(),
            names,
            labelled: HashSet::new(),
            max_labelled,
            other: None,
        }
    }

    /// One tick at `now`: for every claimed slot, closes the slot of time that ended (its
    /// counts join the window; slots of time skipped by a late tick are empty), applies the
    /// rule, stores the new probability, reports changes, and releases slots idle for
    /// `idle_ticks`. Does nothing when no slot of time ended since the last tick.
    pub(crate) fn run(
        &mut self,
        now: u64,
        table: &DestinationTable,
        rule: &ThrottleRule,
        name: &LayerName,
    ) -> TickReport {
        let slot = now / self.slot_nanos;
        let mut report = TickReport::default();
        if slot <= self.last_slot {
            return report;
        }
        let elapsed = slot - self.last_slot;
        self.last_slot = slot;
        while let Ok((index, key, label)) = self.names.try_recv() {
            if let Some(view) = self.views.get_mut(index) {
                if view.key != key {
                    *view = SlotView::default();
                    view.key = key;
                }
                view.name = Some(label);
            }
        }
        let slots = self.slots as u64;
        // Whether a destination reported in `(other)` changed: its value is then decided
        // again, once, after every slot.
        let mut other_changed = false;
        for index in 0..table.capacity() {
            let key = table.key_at(index);
            if key == 0 {
                continue;
            }
            if self.views[index].key != key {
                // A destination new to the tick: an empty window.
                self.views[index] = SlotView {
                    key,
                    ..SlotView::default()
                };
                self.ring[index * self.slots..(index + 1) * self.slots].fill(SlotCounts::default());
            }
            let counts = table.take_levels(index);
            let (newest, refusals) = (counts.sent(), counts.refusals());
            let offered = counts.offered();
            if offered.iter().any(|&n| n > 0) {
                self.views[index].mix = offered;
            }
            let ring = &mut self.ring[index * self.slots..(index + 1) * self.slots];
            let closed = ((slot - 1) % slots) as usize;
            for skipped in 1..elapsed.min(slots) {
                ring[((slot - 1 - skipped) % slots) as usize] = SlotCounts::default();
            }
            ring[closed] = SlotCounts::of(newest);
            if rule.forgives(newest) {
                for (i, older) in ring.iter_mut().enumerate() {
                    if i != closed {
                        older.failures /= 2;
                    }
                }
            }
            let window = ring
                .iter()
                .fold(SentCounts::default(), |sum, c| sum.add(c.counts()));
            let before = table.probability_at(index);
            let after = rule.probability(window, before);
            // NOTE: the levels' probabilities follow the mix of every slot, not only a new
            // probability; one level (or no mix yet) gets `after` itself.
            let levels = split(after, self.views[index].mix);
            if after != before || levels != table.level_probabilities_at(index) {
                table.set_probabilities(index, after, levels);
            }
            if TELEMETRY && after != before {
                other_changed |= self.report_change(index, before, after, now, name);
            }
            report.updated += 1;

            let view = &mut self.views[index];
            view.idle = if newest.sent() == 0 && refusals == 0 {
                view.idle.saturating_add(elapsed)
            } else {
                0
            };
            if view.idle >= self.idle_ticks && table.release(index, key) {
                if TELEMETRY && after > 0 {
                    other_changed |= self.report_change(index, after, 0, now, name);
                }
                self.views[index] = SlotView::default();
                self.ring[index * self.slots..(index + 1) * self.slots].fill(SlotCounts::default());
                report.released += 1;
            }
        }
        if other_changed {
            self.report_others(table, name);
        }
        report
    }

    /// Sets `(other)` to the highest probability among the destinations reported there.
    #[cold]
    fn report_others(&mut self, table: &DestinationTable, name: &LayerName) {
        let highest = self
            .views
            .iter()
            .enumerate()
            .filter(|(_, view)| matches!(view.series, Series::Other))
            .map(|(index, _)| table.probability_at(index))
            .max()
            .unwrap_or(0);
        self.other
            .get_or_insert_with(|| probability_gauge(name, OTHER_DESTINATIONS))
            .set(from_units(highest));
    }

    /// Sets the gauge of slot `index` and logs when its throttling begins or ends. Returns
    /// whether the slot is reported in `(other)` (whose value the caller decides again).
    #[cold]
    fn report_change(
        &mut self,
        index: usize,
        before: u64,
        after: u64,
        now: u64,
        name: &LayerName,
    ) -> bool {
        let view = &mut self.views[index];
        let destination = view.name.as_deref().unwrap_or("(unnamed)");
        let probability = from_units(after);
        if before == 0 && after > 0 {
            view.throttling_since = Some(now);
            throttling_began(name, destination, probability);
        } else if after == 0 {
            let since = view.throttling_since.take().unwrap_or(now);
            throttling_ended(
                name,
                destination,
                Duration::from_nanos(now.saturating_sub(since)),
            );
        }
        // NOTE: a destination's series is decided the first time it is throttled, never for
        // a destination that never fails; a recorder keeps every series it was given, so
        // only the first `max_labelled` destinations (by name: one throttled again after
        // its slot was released keeps its series) get one of their own.
        if matches!(view.series, Series::Undecided) {
            let own = self.labelled.contains(destination)
                || (self.labelled.len() < self.max_labelled
                    && self.labelled.insert(destination.into()));
            view.series = if own {
                Series::Own(probability_gauge(name, destination))
            } else {
                Series::Other
            };
        }
        match &view.series {
            Series::Own(gauge) => {
                gauge.set(probability);
                false
            }
            Series::Other | Series::Undecided => true,
        }
    }
}
