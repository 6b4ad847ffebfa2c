//! Client-side adaptive throttling: when a destination keeps failing, most of its requests
//! fail at once, locally, and a few still go as probes.
//!
//! A retry budget bounds *retries*; nothing in it reduces *first attempts*. When a server
//! stops answering, a fleet of clients keeps sending its normal load; the server's listen
//! queue fills with requests whose callers give up long before the server reads them, and on
//! resume it works through all of them while new requests time out behind them and become
//! more abandoned work (the outage experiment of this workspace's README shows a bare server
//! that never comes back that way). The throttle is what a client stack does about it alone:
//! it notices that a destination has stopped accepting what it is sent, refuses most of the
//! requests to it before they leave the process, and lets it rise.
//!
//! It is on by default in every [`RetryLayer`](crate::RetryLayer) (one per layer, named after
//! it); [`RetryBuilder::throttle`](crate::RetryBuilder::throttle) gives a layer one you built,
//! [`RetryBuilder::no_throttle`](crate::RetryBuilder::no_throttle) turns it off.
//!
//! # The rule
//!
//! Per destination, over a short sliding window (2 s in slots of 200 ms by default), the
//! throttle counts the attempts it **sent** and how they ended: accepted or failed. Every
//! slot (a ticker task, 200 ms) it decides the destination's refusal probability:
//!
//! ```text
//! p = min(max_probability, max(0, (sent - K * accepts) / (sent + 1)))
//! ```
//!
//! the SRE book's formula with its K = 2, with three changes that make it react within a
//! 20 s outage and reopen within a second of recovery:
//!
//! 1. **Counts of what was sent, over 2 s.** The SRE book counts every request, refused ones
//!    included, over 2 minutes; gRPC-Go's throttler over 30 s in 100 bins (with `+8` where
//!    the book has `+1`); Envoy's admission control over 30 s (success rate threshold 95 %,
//!    rejection capped at 80 %). After a window full of successes none of them, with its
//!    defaults, refuses anything within a 20 s outage: failures must first outnumber half
//!    the window's successes. Over 2 s they do within about a second, and at once for a
//!    destination that went silent (its timeouts arrive after the silence has emptied the
//!    window of successes): the first slot of failures starts the throttle.
//! 2. **Refused requests are not counted.** In the book's formula they count as requests
//!    that were not accepted, so at a probability near 1 the throttle reopens only as fast as
//!    its few probes accumulate accepts against a window of refusals. Here the evidence is
//!    only what was sent: when the probes succeed, the accepts outnumber the failures within
//!    a slot or two, and the probability falls to 0. Besides, each slot in which the
//!    destination accepted at least K times as many attempts as failed (at least one)
//!    **halves the failures** still counted from older slots, so an outage is forgotten in a
//!    few slots rather than a whole window.
//! 3. **A floor of probes.** The probability never passes `max_probability` (0.9): one
//!    request in ten always goes, so a destination that comes back is seen within one
//!    request's round trip. The SRE book and gRPC-Go have no cap, Envoy caps at 0.8.
//!
//! Two more rules keep it from doing harm:
//!
//! - **A threshold to start.** A destination is not throttled until its window holds
//!   `min_failures` (10) failures, so chance on a few requests cannot start it; once
//!   throttled, it needs none to stay so (its probes alone may fail fewer than 10 times a
//!   window).
//! - **No evidence, no change.** A window without a sent outcome (probes still in flight, or
//!   no request) keeps the probability as it was; a destination without any request for 10
//!   windows gives its place in the table up, and with it its probability.
//!
//! What this guarantees: **a destination that accepts at least half of what it is sent
//! (1/K) is never refused anything**, whatever its failures (with K = 2, `sent - 2 *
//! accepts <= 0`); a healthy one never; one that steadily rejects 20 % of its requests
//! (a rate limit at 80 % of the offered load) only by chance, when over 10 failures
//! outnumber the accepts of a whole window, under 1e-4 per window at 100 requests per
//! second. Below half, the throttle sends roughly `sqrt(2 * accepted * offered)`: more than
//! the book's `2 * accepted`, as it does not count what it refused.
//!
//! # Levels of criticality
//!
//! A destination's probability `p` says how much of what its clients offer it is sent; the
//! throttle chooses **which** requests by their [`Criticality`] (the level the retry layer
//! sends on the wire, `critical` when none), from the bottom. At each slot it reads how many
//! requests of each level the destination was offered in the newest slot that had any
//! (attempts sent and requests refused), and places the `p * offered` refusals on the lowest
//! level first: `sheddable` is refused outright before any `sheddable-plus` request is
//! refused, and so on up. A level with requests of its own gets the probability that makes
//! its share; a level not seen in the slot is refused outright when a level above it is
//! refused at all, and not at all otherwise (until the next slot sees it).
//!
//! ```text
//! refusals = p * (n_sheddable + n_sheddable_plus + n_critical + n_critical_plus)
//! p_level  = min(1, refusals left after the lower levels / n_level)
//! ```
//!
//! What this guarantees, between two ticks (a decision holds for a slot of 200 ms):
//!
//! - **while a request of a level is sent, no request of a higher level is refused**: a
//!   level's probability is below 1 only when every higher level's is 0;
//! - **the same throttle**: the rule, its window, its threshold, its cap and its
//!   forgiveness read the outcomes of every level together, and the expected number refused
//!   is `p` times the offered load as without levels; the probes that see a destination
//!   come back are its highest levels' requests;
//! - **one level is throttled exactly as without levels**: a client whose requests are all
//!   of one level draws each request against `p` itself, with the same random draws, decision
//!   by decision.
//!
//! What it does not: the mix is the newest slot's, so a level that appears in a slot is
//! decided as "not seen" until the next tick (up to 200 ms); and between destinations
//! nothing is shared (each has its own mix). There is no setting: the order of the levels
//! is the protocol's, and the rule sends no more and no less than without them.
//!
//! [`Criticality`]: overload_signal::protocol::Criticality
//!
//! # What counts
//!
//! For each attempt sent (first attempts and retries), its [outcome in the workspace's
//! vocabulary](overload_signal::protocol#outcomes):
//!
//! - **failed**: a capacity signal ([`Outcome::is_capacity_signal`]): `429`, `503`, `504`,
//!   gRPC `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED` and `UNAVAILABLE`, the stop signal, and
//!   every error without an answer (a timeout, a refused or reset connection);
//! - **accepted**: any other answer: a success, a client error, and a server failure that
//!   is not about capacity (a bug's `500`, a `501`, a `502`): the destination answered, and
//!   a bug is not overload, so a route answering `500` never throttles its host;
//! - **neither**: a [`Throttled`] from a throttle below (never sent), and an attempt whose
//!   future its caller dropped (its outcome is never seen: put the timeout under the retry
//!   layer, as its `attempt_timeout` and deadline are).
//!
//! A gRPC call whose status comes in trailers, after the response started, counts as
//! accepted: the destination took the call (every rejection, and every capacity signal
//! gRPC servers send, is a trailers-only answer, whose status is in the headers).
//!
//! [`Outcome::is_capacity_signal`]: overload_signal::protocol::Outcome::is_capacity_signal
//!
//! # Scope and memory
//!
//! Per destination by default: the request URI's scheme, host and port
//! ([`ThrottleScope::Destination`]; never its user information), so a failing destination
//! never throttles a healthy one behind the same client stack. [`ThrottleScope::Route`]
//! keeps each path of a destination apart, a [`ThrottleKey`] in a request's extensions
//! names a route of your own, and [`ThrottleScope::Layer`] makes one state of every
//! request. Requests without an authority share one destination: a tonic generated
//! client's requests carry their channel's origin at the layer only when the client is built
//! `with_origin` (then two channels behind one layer are two destinations); or name them
//! with a [`ThrottleKey`]. A throttle is shared by every clone of the layer that
//! made it (and by every layer given a clone of it), so behind a pool of client tasks it
//! sees the whole load of each destination.
//!
//! The table is fixed at the first request: `max_destinations` (256) slots in buckets of 8,
//! about 310 bytes each with the tick's window, mix of levels and names (a 256-destination
//! throttle takes about 80 KiB, allocated on its first request). A destination takes a free slot of its
//! bucket, found by a keyed hash of its scheme, host and port (and route or key). **Beyond
//! the bound**, a destination whose bucket holds 8 others is sent **without throttling**
//! (it fails open: never refused, never counted), counted in
//! `backoff_layer_throttle_untracked_total` and logged once; a destination without a request
//! for 10 windows (20 s) gives its slot up.
//!
//! # With the retry budget
//!
//! The throttle decides on **requests**, before their first attempt; the budget still
//! governs **retries**. A refused request is never sent, makes no deposit in the budget (so
//! retries shrink with what the throttle lets through), and is returned at once as a
//! [`Throttled`] error: it is final for every retry layer above, which never retries it.
//! Retries of a request that was let through are not asked again: they are the budget's
//! (at most 10 % of the first attempts sent), and their outcomes count like any attempt's.
//!
//! # Examples
//!
//! Every retry layer has one with the defaults:
//!
//! ```
//! use backoff_layer::RetryLayer;
//!
//! let layer = RetryLayer::new(); // throttled per destination, 2 s window, K = 2
//! # let _ = layer;
//! ```
//!
//! Customised, and shared by two layers (one per route to the same services), named after
//! what it protects; and a layer without one:
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::RetryLayer;
//! use backoff_layer::throttle::Throttle;
//!
//! let throttle = Throttle::builder()
//!     .name("inventory")
//!     .window(Duration::from_secs(5))
//!     .slots(25)
//!     .max_probability(0.8)
//!     .min_failures(20)
//!     .max_destinations(64)
//!     .build()?;
//! let reads = RetryLayer::builder().name("inventory-reads").throttle(throttle.clone()).build()?;
//! let writes = RetryLayer::builder().name("inventory-writes").throttle(throttle).build()?;
//! let unthrottled = RetryLayer::builder().no_throttle().build()?;
//! # let _ = (reads, writes, unthrottled);
//!
//! // Invalid settings are refused by name.
//! let err = Throttle::builder().max_probability(1.0).build().unwrap_err();
//! assert_eq!(err.to_string(), "max_probability must be within 0..1, both excluded, got 1.0");
//! # Ok::<(), backoff_layer::ConfigError>(())
//! ```
//!
//! # Defaults
//!
//! | setting | default | source |
//! |---|---|---|
//! | window | 2 s ([`Throttle::DEFAULT_WINDOW`]) | this crate: reacts within a 20 s outage after a window of successes; the SRE book's 2 min, gRPC-Go's and Envoy's 30 s do not |
//! | slots | 10, a decision every 200 ms ([`Throttle::DEFAULT_SLOTS`]) | gRPC-Go's bins (100 over 30 s), fewer |
//! | K | 2 ([`Throttle::DEFAULT_MULTIPLIER`]) | the SRE book |
//! | highest refusal probability | 0.9: one request in ten always probes ([`Throttle::DEFAULT_MAX_PROBABILITY`]) | Envoy's 0.8 cap, a little higher |
//! | failures to start | 10 per window ([`Throttle::DEFAULT_MIN_FAILURES`]) | Envoy's `rps_threshold`, counted in failures |
//! | destinations | 256, beyond them not throttled ([`Throttle::DEFAULT_MAX_DESTINATIONS`]) | |
//! | destinations with a series of their own | 32, the rest in `(other)` ([`Throttle::DEFAULT_MAX_LABELLED_DESTINATIONS`]) | |
//! | scope | scheme, host and port ([`ThrottleScope::Destination`]) | the SRE book's per-backend throttle |
//! | name | the retry layer's (`"default"` for one built alone) | |
//!
//! # Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) facade, labelled with the throttle's name
//! (the layer's, for the throttle a layer makes); the counters register on the first
//! request, a destination's gauge the first time it is throttled.
//!
//! **A bounded set of series.** A recorder keeps every series it is given (the facade
//! cannot delete one), and the destinations a client reaches may be chosen by its users (a
//! webhook, a forward proxy): so only the first `max_labelled_destinations` (32) destinations
//! throttled get a gauge series of their own, kept for the life of the throttle; every later
//! one is reported in one shared series, `destination="(other)"`, which shows the highest
//! refusal probability among them. A throttle has at most 38 series, however many
//! destinations it sees: 32 gauges, `(other)` and its five counters (one refused counter
//! per level, and the untracked one)
//! ([`ThrottleBuilder::max_labelled_destinations`] changes the 32). Logs still name every
//! destination, once when its throttling begins and once when it ends.
//!
//! **No credentials.** A destination is named by its scheme, host and port (and route or
//! [`ThrottleKey`]): never the user information of its URI (`http://user:secret@host`),
//! never its query, in a label, a log field or an error.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `backoff_layer_throttle_refused_total` | counter | `name`, `criticality` (`sheddable`, `sheddable-plus`, `critical`, `critical-plus`) | requests refused locally, not sent, by the request's level |
//! | `backoff_layer_throttle_probability` | gauge | `name`, `destination` (`http://10.0.0.7:8080`, or `(other)`) | the destination's refusal probability, 0 when it is not throttled; for `(other)`, the highest among the destinations without a series of their own |
//! | `backoff_layer_throttle_untracked_total` | counter | `name` | requests to a destination the table had no room for, sent without throttling |
//!
//! # Logs
//!
//! Through [`tracing`](https://docs.rs/tracing), once per change, never per request: a
//! destination's throttling beginning (`WARN`, with `name`, `destination` and
//! `probability`) and ending (`INFO`, with `lasted_ms`); the table full (`WARN`) and no
//! longer (`INFO`, after 10 windows without an untracked request).
//!
//! # Cost and concurrency
//!
//! A request to a destination that is not throttled costs a keyed hash of its scheme, host
//! and port, one cache line of keys, one load of its level's probability, and one
//! `fetch_add` for its outcome (on its level's counter); no lock, no allocation, no clock
//! read. Only the first request to a new
//! destination allocates (its name, for the gauge), and only a throttled destination's
//! requests draw a random number. The window's slots are closed by a ticker task that the
//! first request spawns on its tokio runtime and that ends with the throttle; it takes the
//! counters with a `swap`, so no outcome is lost. The table's lock-free parts are checked
//! with [loom](https://docs.rs/loom).
//!
//! **Across runtimes.** A throttle built once and used from several runtimes, one after the
//! other (a client in a `static`, a synchronous wrapper that builds a runtime per call, a
//! test suite sharing a client), keeps throttling: when the runtime that ran its ticker
//! shuts down, the next request starts a ticker on its own runtime. A ticker that is late
//! (a client starved of CPU) is not taken for a dead one: the throttle keeps refusing at
//! the last probability until the next tick moves it on the probes' outcomes. A
//! current-thread runtime kept between `block_on` calls runs its ticker only inside them:
//! the first requests of a call after an idle spell are decided at the probability the
//! last tick left, until the ticker catches up (at the call's first await). Without a
//! runtime nothing ticks and nothing is refused.

mod config;
mod evidence;
mod refused;
mod rule;
mod scope;
mod shared;
mod table;
mod telemetry;
mod tick;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub use config::{Throttle, ThrottleBuilder};
pub use refused::{Throttled, is_throttled};
pub use scope::{ThrottleKey, ThrottleScope};

pub(crate) use evidence::{of_error, of_outcome};
pub(crate) use scope::{DestinationKeys, Target, server_address};
pub(crate) use table::ThrottleTicket;
