//! The probe's task across runtimes, without a Redis: a listener that takes connections
//! and never answers.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::Ordering;
use std::time::Duration;

use overload_core::clock::TokioClock;
use overload_core::telemetry::LayerName;

use super::*;
use crate::algorithm::TokenBucket;
use crate::redis::script::Sealed;

/// A layer's state whose store connects to `port`, probing every `recheck`, waiting a
/// minute for an answer.
fn state(port: u16, recheck: Duration) -> Arc<RedisDeciderState<TokioClock>> {
    let store = RedisStore::builder(&format!("redis://127.0.0.1:{port}"))
        .response_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let scripted = TokenBucket::new(10).unwrap().scripted().unwrap();
    let settings = RedisSettings {
        store,
        namespace: format!("test:default:{}:", scripted.tag).into_bytes(),
        scripted,
        budget: Duration::from_millis(5),
        recheck,
        capacity: 10,
        max_new_keys: 10,
        secret: FleetSecret::new(None, "test"),
        reservation: None,
        away_after: 3,
        name: LayerName::default(),
    };
    RedisDeciderState::new(settings, TokioClock::new()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Regression (issue 30, finding 1): the flag that keeps a second probe from starting was
/// reset by the probe's task when it finished, so a probe that its runtime dropped (the
/// runtime shut down while the probe waited for Redis) left it set for good, and no probe
/// ever ran again. The flag is reset by a guard the task owns, however the task goes.
#[test]
fn a_probe_dropped_with_its_runtime_lets_the_next_one_start() {
    // Takes connections (the kernel's backlog) and never answers.
    let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let state = state(
        silent.local_addr().unwrap().port(),
        Duration::from_millis(10),
    );
    let first = runtime();
    first.block_on(async {
        state.spawn_probe();
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    assert!(
        state.probing.load(Ordering::Acquire),
        "the probe waits for its answer"
    );
    drop(first);
    assert!(
        !state.probing.load(Ordering::Acquire),
        "the runtime dropped the probe, and its guard said so"
    );
    let second = runtime();
    second.block_on(async {
        state.spawn_probe();
        tokio::task::yield_now().await;
    });
    assert_eq!(
        state.probes.load(Ordering::Relaxed),
        2,
        "a probe ran on the second runtime"
    );
}

/// A runtime that drops what is spawned on it unpolled (one shutting down) costs a probe
/// per recheck interval, not one per call.
#[test]
fn a_runtime_that_drops_its_probes_is_tried_once_per_recheck_interval() {
    let state = state(1, Duration::from_secs(3_600));
    let runtime = runtime();
    let handle = runtime.handle().clone();
    runtime.shutdown_background();
    let _entered = handle.enter();
    for _ in 0..10 {
        state.spawn_probe();
        assert!(!state.probing.load(Ordering::Acquire));
    }
    assert_eq!(
        state.probes.load(Ordering::Relaxed),
        1,
        "one in the interval"
    );
}
