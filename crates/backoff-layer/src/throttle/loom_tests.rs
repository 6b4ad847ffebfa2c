//! Model tests of the destination table under loom: every interleaving of the request
//! path's claims and counts with the tick's takes and releases.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p backoff-layer --lib --release loom`.

use loom::sync::Arc;
use loom::thread;

use super::table::{Claim, DestinationTable, ThrottleOutcome, ThrottleTicket};

const A: u64 = 2 | (7 << 32);
const B: u64 = 6 | (7 << 32);

fn ticket(claim: Claim) -> ThrottleTicket {
    match claim {
        Claim::Known(t) | Claim::New(t) => t,
        Claim::Full => panic!("a bucket of 8 has room"),
    }
}

#[test]
fn loom_two_requests_claiming_one_destination_share_one_slot() {
    loom::model(|| {
        let table = Arc::new(DestinationTable::new(8));
        let other = Arc::clone(&table);
        let t = thread::spawn(move || other.claim(A));
        let mine = table.claim(A);
        let theirs = t.join().unwrap();
        // Exactly one of them claimed it; both hold the same slot.
        assert!(matches!(
            (mine, theirs),
            (Claim::New(_), Claim::Known(_)) | (Claim::Known(_), Claim::New(_))
        ));
        assert_eq!(ticket(mine), ticket(theirs));
        let held = (0..table.capacity())
            .filter(|&i| table.key_at(i) == A)
            .count();
        assert_eq!(held, 1);
    });
}

#[test]
fn loom_two_destinations_in_one_bucket_take_two_slots() {
    loom::model(|| {
        let table = Arc::new(DestinationTable::new(8));
        let other = Arc::clone(&table);
        let t = thread::spawn(move || other.claim(B));
        let a = ticket(table.claim(A));
        let b = ticket(t.join().unwrap());
        assert_ne!(a.index(), b.index());
        assert_eq!(table.find(A), Some(a));
        assert_eq!(table.find(B), Some(b));
    });
}

#[test]
fn loom_no_outcome_is_lost_to_a_concurrent_tick() {
    loom::model(|| {
        let table = Arc::new(DestinationTable::new(8));
        let a = ticket(table.claim(A));
        let other = Arc::clone(&table);
        let t = thread::spawn(move || {
            other.record(a, ThrottleOutcome::Failed);
            other.record(a, ThrottleOutcome::Accepted);
        });
        table.refused(a);
        // The tick takes the counters while the outcomes come in.
        let (first, refusals_first) = table.take(a.index());
        t.join().unwrap();
        let (rest, refusals_rest) = table.take(a.index());
        let sum = first.add(rest);
        assert_eq!((sum.accepts, sum.failures), (1, 1));
        assert_eq!(refusals_first + refusals_rest, 1);
    });
}

#[test]
fn loom_a_release_frees_only_the_destination_it_releases() {
    loom::model(|| {
        let table = Arc::new(DestinationTable::new(8));
        let a = ticket(table.claim(A));
        table.set_probability(a.index(), 1 << 31);
        let other = Arc::clone(&table);
        // A request to another destination claims a slot while the tick releases A's.
        let t = thread::spawn(move || other.claim(B));
        let released = table.release(a.index(), A);
        let b = ticket(t.join().unwrap());
        assert!(released);
        assert_eq!(table.find(A), None);
        assert_eq!(table.find(B), Some(b));
        // A slot B took after the release starts from nothing.
        assert_eq!(table.probability(b), 0);
        // A release for a key the slot no longer holds frees nothing.
        assert!(!table.release(b.index(), A));
        assert_eq!(table.find(B), Some(b));
    });
}
