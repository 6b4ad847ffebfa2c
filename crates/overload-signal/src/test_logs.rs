//! Tracing for tests: a subscriber that keeps every event logged while it is the default,
//! and the anchor that keeps callsite interest right while tests run in parallel.

use std::sync::Mutex;

/// An event the layer logged: its level, message and fields.
#[derive(Clone, Debug)]
pub(crate) struct Logged {
    pub(crate) level: tracing::Level,
    pub(crate) message: String,
    pub(crate) fields: Vec<(String, String)>,
}

impl Logged {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Keeps every event logged while it is the thread's default subscriber.
#[derive(Default)]
pub(crate) struct LogCapture(Mutex<Vec<Logged>>);

impl LogCapture {
    /// The events whose message contains `needle`.
    pub(crate) fn with_message(&self, needle: &str) -> Vec<Logged> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.message.contains(needle))
            .cloned()
            .collect()
    }
}

struct FieldVisitor<'a>(&'a mut Logged);

impl tracing::field::Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let value = format!("{value:?}");
        if field.name() == "message" {
            self.0.message = value;
        } else {
            self.0.fields.push((field.name().to_owned(), value));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0
            .fields
            .push((field.name().to_owned(), value.to_owned()));
    }
}

impl tracing::Subscriber for LogCapture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut logged = Logged {
            level: *event.metadata().level(),
            message: String::new(),
            fields: Vec::new(),
        };
        event.record(&mut FieldVisitor(&mut logged));
        self.0.lock().unwrap().push(logged);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Keeps tracing's per-callsite interest right while tests run in parallel: the interest is
/// cached process-wide, computed on the thread that reaches a callsite first, and a sibling
/// test's thread (no subscriber) would cache "never", so the counting test would miss its
/// event (seen once in a full parallel run). A global subscriber interested in every
/// callsite and enabling none keeps two dispatchers alive, so the interest is the union.
pub(crate) fn anchor_interest() {
    struct Anchor;
    impl tracing::Subscriber for Anchor {
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            false
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // NOTE: another global subscriber already installed serves as well.
        let _ = tracing::subscriber::set_global_default(Anchor);
    });
}
