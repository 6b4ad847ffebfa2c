//! [`ThrottleShared`]: one throttle's settings and state, shared by every clone of it and
//! every layer it was given to: the request path (`admit`, `record`) and the tick.

use std::fmt;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use overload_core::clock::Clock;
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, Ticker};
use overload_signal::protocol::Criticality;

use crate::backoff::Seeds;
use crate::throttle::refused::Throttled;
use crate::throttle::rule::{ThrottleRule, from_units};
use crate::throttle::scope::{DestinationKeys, Target, ThrottleScope};
use crate::throttle::table::{Claim, DestinationTable, ThrottleOutcome, ThrottleTicket};
use crate::throttle::telemetry::{ThrottleMetrics, untracked_began, untracked_ended};
use crate::throttle::tick::{ClaimedLabel, TickReport, TickState};

/// A throttle's settings, checked by its builder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ThrottleSettings {
    pub(crate) rule: ThrottleRule,
    pub(crate) window: Duration,
    pub(crate) slots: u32,
    pub(crate) max_destinations: usize,
    /// Destinations with a gauge series of their own; the others share one.
    pub(crate) max_labelled_destinations: usize,
    pub(crate) scope: ThrottleScope,
}

/// Windows without a request after which a destination's slot is released.
pub(crate) const IDLE_WINDOWS: u64 = 10;

/// The table and the tick's state, made on the first request.
struct ThrottleState {
    table: DestinationTable,
    names: Sender<ClaimedLabel>,
    tick: Mutex<TickState>,
}

/// One throttle; see the [module docs](self).
pub(crate) struct ThrottleShared {
    settings: ThrottleSettings,
    slot_nanos: u64,
    keys: DestinationKeys,
    clock: Box<dyn Clock>,
    /// The draws of throttled destinations' requests.
    seeds: Seeds,
    metrics: LazyMetrics<ThrottleMetrics>,
    state: OnceLock<ThrottleState>,
    /// The task that closes a slot of time every `slot_nanos`: started by the first
    /// request, and again by a later one when the runtime that ran it has shut down (a
    /// client built once and used from several runtimes).
    ticker: Ticker,
    /// Requests sent to a destination the table had no room for.
    untracked: Episode,
}

impl fmt::Debug for ThrottleShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("name", self.name())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ThrottleShared {
    pub(crate) fn new(
        settings: ThrottleSettings,
        name: LayerName,
        clock: Box<dyn Clock>,
        seeds: Seeds,
    ) -> Self {
        let slot_nanos = overload_core::clock::saturating_nanos(settings.window)
            / u64::from(settings.slots).max(1);
        Self {
            slot_nanos: slot_nanos.max(1),
            keys: DestinationKeys::new(settings.scope),
            settings,
            clock,
            seeds,
            metrics: LazyMetrics::new(name),
            state: OnceLock::new(),
            ticker: Ticker::new(),
            untracked: Episode::new(),
        }
    }

    pub(crate) const fn settings(&self) -> &ThrottleSettings {
        &self.settings
    }

    pub(crate) const fn name(&self) -> &LayerName {
        self.metrics.name()
    }

    /// The table, made (and the metrics registered) on the first request.
    #[inline]
    fn state(&self) -> &ThrottleState {
        self.state.get_or_init(|| self.make_state())
    }

    #[cold]
    fn make_state(&self) -> ThrottleState {
        let _ = self.metrics.get();
        let table = DestinationTable::new(match self.settings.scope {
            ThrottleScope::Layer => 1,
            _ => self.settings.max_destinations,
        });
        let (names, received) = channel();
        let now = self.clock.now();
        let slots = self.settings.slots as usize;
        let tick = TickState::new(
            table.capacity(),
            slots,
            self.slot_nanos,
            IDLE_WINDOWS * slots as u64,
            self.settings.max_labelled_destinations,
            now,
            received,
        );
        ThrottleState {
            table,
            names,
            tick: Mutex::new(tick),
        }
    }

    /// Decides whether a request to `target` is sent: `Ok(Some(ticket))` to record its
    /// attempts' outcomes with, `Ok(None)` for a destination the table has no room for
    /// (sent, not throttled), or `Err` when the throttle refuses it.
    ///
    /// `level` is the request's: the probability it is refused with is its level's share
    /// of the destination's (see `rule::split`).
    #[inline]
    pub(crate) fn admit(
        self: &Arc<Self>,
        target: Target<'_>,
        level: Criticality,
    ) -> Result<Option<ThrottleTicket>, Throttled> {
        let state = self.state();
        self.ticker.start(
            self,
            Duration::from_nanos(self.slot_nanos),
            |_| {},
            Self::tick_now,
        );
        let key = self.keys.key(target);
        let ticket = match state.table.find(key) {
            Some(ticket) => ticket,
            None => match self.claim(state, key, target) {
                Some(ticket) => ticket,
                None => return Ok(None),
            },
        }
        .at(level);
        let probability = state.table.probability(ticket);
        if probability == 0 {
            return Ok(Some(ticket));
        }
        self.draw(state, ticket, probability)
    }

    /// A slot for a destination not in the table yet.
    #[cold]
    fn claim(&self, state: &ThrottleState, key: u64, target: Target<'_>) -> Option<ThrottleTicket> {
        match state.table.claim(key) {
            Claim::Known(ticket) => Some(ticket),
            Claim::New(ticket) => {
                // NOTE: the tick names the destination's gauge and logs with it; a send
                // fails only once the tick's state is gone with the throttle.
                let _ = state
                    .names
                    .send((ticket.index(), key, self.keys.label(target)));
                Some(ticket)
            }
            Claim::Full => {
                self.metrics.get().untracked.increment(1);
                if self.untracked.seen(self.clock.now()) {
                    untracked_began(self.name(), state.table.capacity());
                }
                None
            }
        }
    }

    /// The decision for a destination being throttled: refused with `probability`.
    ///
    /// NOTE: the probability is the last tick's, however long ago that was: a late tick (a
    /// client starved of CPU, which is what a storm looks like) is not a dead ticker, and a
    /// dead one is started again by the next request (see `Ticker`). Refusing stops only
    /// when a tick finds, in the probes' outcomes, that the destination accepts again.
    #[cold]
    fn draw(
        &self,
        state: &ThrottleState,
        ticket: ThrottleTicket,
        probability: u64,
    ) -> Result<Option<ThrottleTicket>, Throttled> {
        if self.seeds.next_seed() >> 32 < probability {
            state.table.refused(ticket);
            self.metrics.get().refused[ticket.level().rank()].increment(1);
            return Err(Throttled::new(from_units(probability)));
        }
        Ok(Some(ticket))
    }

    /// Counts an attempt's outcome for its destination (`None`: nothing to count).
    #[inline]
    pub(crate) fn record(&self, ticket: ThrottleTicket, outcome: Option<ThrottleOutcome>) {
        if let (Some(outcome), Some(state)) = (outcome, self.state.get()) {
            state.table.record(ticket, outcome);
        }
    }

    /// The refusal probability of `target`'s destination now (0 when it is not tracked).
    pub(crate) fn probability(&self, target: Target<'_>) -> f64 {
        let Some(state) = self.state.get() else {
            return 0.0;
        };
        state
            .table
            .find(self.keys.key(target))
            .map_or(0.0, |ticket| {
                from_units(state.table.probability_at(ticket.index()))
            })
    }

    /// One tick at the clock's time: see [`TickState::run`].
    pub(crate) fn tick(&self) -> TickReport {
        let Some(state) = self.state.get() else {
            return TickReport::default();
        };
        let now = self.clock.now();
        let report = state
            .tick
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .run(now, &state.table, &self.settings.rule, self.name());
        if self.untracked.is_active() {
            let quiet = self.settings.window.saturating_mul(IDLE_WINDOWS as u32);
            if let Some(ended) = self.untracked.quiet_for(quiet, now) {
                untracked_ended(self.name(), ended);
            }
        }
        report
    }

    /// What the ticker runs every slot of time.
    fn tick_now(&self) {
        let _ = self.tick();
    }
}
