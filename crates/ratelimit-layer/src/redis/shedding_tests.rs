//! The scripts with a share held back, against a real `redis-server`, on times the tests
//! choose: they must decide as the local limiters' `check_holding_back` does, the answer
//! to a request its held-back share leaves no room for included.

use super::command::{RedisKeyName, command, evalsha};
use super::script::{ScriptArgs, ScriptReply, Sealed};
use super::store::RedisStore;
use super::testing::RedisServer;
use crate::algorithm::{Decision, Limiter, SlidingWindow, TokenBucket};
use crate::rate_limit::decide::held_decision;

/// A small deterministic generator (xorshift), so a failing sequence can be replayed.
struct HeldSteps(u64);

impl HeldSteps {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// The same random sequence of (time step, cost, units held back) through `limiter`
/// locally and in Redis: the same decision (the wait included) and quota status at every
/// step.
async fn agree<L: Limiter + Sealed>(limiter: L, seed: u64, max_step_micros: u64) {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let scripted = limiter.scripted().unwrap();
    let namespace = format!("test:default:{}:", scripted.tag).into_bytes();
    let (mut connection, _) = store.connection().unwrap();
    let state = L::State::default();
    let capacity = limiter.capacity();
    let mut steps = HeldSteps(seed);
    let mut now = 1_700_000_000_000_000_u64;
    let origin = now;
    let (mut admitted, mut held_refused) = (0, 0);
    for i in 0..400 {
        now += steps.next(max_step_micros);
        let cost = u32::try_from(1 + steps.next(3)).unwrap();
        // Mostly nothing held back, else up to the whole capacity less one.
        let held = if steps.next(3) == 0 {
            0
        } else {
            steps.next(capacity)
        };
        let local_now = (now - origin) * 1_000;
        let local = held_decision(
            limiter.check_holding_back(&state, local_now, cost, held),
            cost,
            held,
            capacity,
        );
        let local_status = limiter.status(&state, local_now);
        let args = ScriptArgs {
            now_micros: Some(now),
            held,
            ..ScriptArgs::cost(cost)
        };
        let name = RedisKeyName::Global;
        let cmd = command(&scripted, &namespace, &name, args);
        let reply = evalsha(&mut connection, &cmd, scripted.code).await.unwrap();
        let ScriptReply::Decided {
            decision, status, ..
        } = scripted.read_reply_held(&reply, cost, held).unwrap()
        else {
            panic!("the key may be made");
        };
        assert_eq!(
            decision, local,
            "step {i}, seed {seed}, cost {cost}, held {held}"
        );
        assert_eq!(status, local_status, "step {i}, seed {seed}");
        match decision {
            Decision::Allow => admitted += 1,
            Decision::Reject { retry_after } => {
                assert!(!retry_after.is_zero(), "step {i}: a wait of zero");
                if held > 0 {
                    held_refused += 1;
                }
            }
            Decision::OverCapacity { .. } => {}
        }
    }
    assert!(admitted > 20, "{admitted} admitted");
    assert!(held_refused > 20, "{held_refused} refused");
}

#[tokio::test]
async fn the_bucket_script_holds_back_as_the_local_bucket() {
    for seed in [7, 2_024] {
        agree(
            TokenBucket::builder(10).burst(8).build().unwrap(),
            seed,
            150_000,
        )
        .await;
    }
}

#[tokio::test]
async fn the_sliding_window_script_holds_back_as_the_local_window() {
    for seed in [7, 2_024] {
        agree(SlidingWindow::new(8).unwrap(), seed, 150_000).await;
    }
}
