//! What the tests share: the events this crate logs, recorded.

#![allow(dead_code)] // each test file uses its own part

use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One event this crate logged: its level, its message and its `name` field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Logged {
    pub(crate) level: Level,
    pub(crate) message: String,
    pub(crate) name: Option<String>,
}

/// Records the events this crate logs at `INFO` and above, while its guard lives (on this
/// thread, so under a current-thread runtime: the layer's ticks included).
#[derive(Clone)]
pub(crate) struct Logs {
    events: Arc<Mutex<Vec<Logged>>>,
    /// The targets (crates) whose events are recorded.
    targets: &'static [&'static str],
}

impl Logs {
    /// Records this crate's events from now until the guard is dropped.
    pub(crate) fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        Self::capture_from(&["ratelimit_layer"])
    }

    /// Records the events of the crates `targets` from now until the guard is dropped.
    pub(crate) fn capture_from(
        targets: &'static [&'static str],
    ) -> (Self, tracing::subscriber::DefaultGuard) {
        anchor_interest();
        let logs = Self {
            events: Arc::default(),
            targets,
        };
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
        tracing::callsite::rebuild_interest_cache();
        (logs, guard)
    }

    /// The events at `level` whose message contains `text`.
    pub(crate) fn at(&self, level: Level, text: &str) -> Vec<Logged> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.level == level && l.message.contains(text))
            .cloned()
            .collect()
    }
}

struct Fields {
    message: String,
    name: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "name" => self.name = Some(format!("{value:?}")),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "name" {
            self.name = Some(value.to_owned());
        } else {
            self.record_debug(field, &value);
        }
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Logs {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let level = *event.metadata().level();
        let target = event.metadata().target();
        if !self.targets.iter().any(|t| target.starts_with(t)) || level > Level::INFO {
            return;
        }
        let mut fields = Fields {
            message: String::new(),
            name: None,
        };
        event.record(&mut fields);
        self.events.lock().unwrap().push(Logged {
            level,
            message: fields.message,
            name: fields.name,
        });
    }
}

/// Keeps tracing's per-callsite interest right while tests run in parallel: the interest is
/// cached process-wide, computed on the thread that reaches a callsite first, and with one
/// dispatcher alive a sibling test's thread (no subscriber) would cache "never", so a
/// capturing test would miss the event. A global subscriber interested in every callsite and
/// enabling none keeps two dispatchers alive, so the interest is the union.
fn anchor_interest() {
    struct Anchor;
    impl<S: Subscriber> tracing_subscriber::Layer<S> for Anchor {
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
            false
        }
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // NOTE: another global subscriber already installed serves as well.
        let _ =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Anchor));
    });
}
