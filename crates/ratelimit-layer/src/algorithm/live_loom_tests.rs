//! Model tests of [`LiveTokenBucket`]'s lazy conversion under loom: every interleaving of a
//! few threads.
//!
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p ratelimit-layer --lib --release loom`
//!
//! A key's TAT and its generation are loom's atomics under `cfg(loom)` (the crate's `sync`
//! shim), and the wait for a conversion under way is loom's spin hint. The parameters' `Arc`
//! is swapped by `arc_swap`, whose own atomics loom does not see: the models take the swap
//! as one step. They check that a key is converted exactly once per change (twice would
//! scale its backlog twice: fewer units free than the new limit leaves), that no update of
//! its TAT is lost, and that around a change no more is admitted than the units free.

use loom::sync::Arc;
use loom::thread;
use overload_core::clock::Clock;
use overload_core::sync::Ordering;

use super::{LiveTokenBucket, LiveTokenBucketState};
use crate::algorithm::{Limiter, TokenBucket};

const MS: u64 = 1_000_000;

/// A clock that stands at 0: every change and every request at the same instant.
struct Still;

impl Clock for Still {
    fn now(&self) -> u64 {
        0
    }
}

/// 10 per second (T = 100 ms), bursts of 2, with 1 unit in use (TAT = 100 ms).
fn one_unit_in_use() -> (
    Arc<LiveTokenBucket>,
    super::TokenBucketHandle,
    Arc<LiveTokenBucketState>,
) {
    let (bucket, handle) =
        LiveTokenBucket::new(TokenBucket::builder(10).burst(2).build().unwrap(), Still);
    let state = LiveTokenBucketState::default();
    assert!(bucket.check(&state, 0, 1).is_allowed());
    (Arc::new(bucket), handle, Arc::new(state))
}

/// 5 per second (T' = 200 ms), bursts of 2: the unit in use stays in use (a backlog of
/// 200 ms), so 1 unit is free.
fn slower() -> TokenBucket {
    TokenBucket::builder(5).burst(2).build().unwrap()
}

fn admitted(threads: Vec<thread::JoinHandle<bool>>) -> usize {
    threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|admitted| *admitted)
        .count()
}

fn request(
    bucket: &Arc<LiveTokenBucket>,
    state: &Arc<LiveTokenBucketState>,
) -> thread::JoinHandle<bool> {
    let (bucket, state) = (Arc::clone(bucket), Arc::clone(state));
    thread::spawn(move || bucket.check(&state, 0, 1).is_allowed())
}

/// Two requests race to convert a key after a change: one converts, the other waits, and
/// exactly the one unit the new limit leaves free is admitted.
#[test]
fn loom_two_requests_convert_a_key_once() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let (bucket, handle, state) = one_unit_in_use();
        handle.set(slower());
        let threads = vec![request(&bucket, &state), request(&bucket, &state)];
        assert_eq!(admitted(threads), 1);
        // Converted once (200 ms of backlog), then one unit of 200 ms taken.
        assert_eq!(state.generation.load(Ordering::Acquire), 1);
        assert_eq!(state.inner.tat.load(Ordering::Acquire), 400 * MS);
    });
}

/// A change races two requests: whichever parameters each decides under, one unit is
/// admitted (one was free before and one after), and afterwards the key is within the new
/// burst with nothing left.
#[test]
fn loom_a_change_racing_requests_admits_no_more_than_is_free() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let (bucket, handle, state) = one_unit_in_use();
        let change = thread::spawn(move || handle.set(slower()));
        let threads = vec![request(&bucket, &state), request(&bucket, &state)];
        change.join().unwrap();
        assert_eq!(admitted(threads), 1);
        assert!(!bucket.check(&state, 0, 1).is_allowed());
        assert_eq!(state.generation.load(Ordering::Acquire), 1);
        // The new limit's bound: at most its burst (2 × 200 ms) of backlog.
        assert!(state.inner.tat.load(Ordering::Acquire) <= 400 * MS);
    });
}
