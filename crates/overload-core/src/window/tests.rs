use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::*;
use crate::ConfigErrorKind;
use crate::clock::FakeClock;

const MS: u64 = 1_000_000;

/// A window of `slots` slots of 1 ms each on a fake clock.
fn window<const N: usize>(slots: u32, stripes: u32) -> (Window<N, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let w = Window::<N>::builder()
        .window(Duration::from_millis(u64::from(slots)))
        .slots(slots)
        .stripes(stripes)
        .clock(clock.clone())
        .build()
        .unwrap();
    (w, clock)
}

fn at_most(limit: u64) -> impl Fn(&Counts<1>) -> bool {
    move |c| c.taken() < limit
}

#[test]
fn defaults() {
    let w = Window::<3>::new();
    assert_eq!(w.window(), Duration::from_secs(10));
    assert_eq!(w.slot_width(), Duration::from_secs(1));
    assert_eq!(w.slots(), 10);
    assert!(w.stripes().is_power_of_two());
    assert!(w.stripes() <= Window::<3>::MAX_DEFAULT_STRIPES);
    let d = format!("{w:?}");
    assert!(d.contains("counters: 3") && d.contains("slots: 10"), "{d}");
}

#[test]
fn invalid_configurations_are_refused_by_name() {
    let cases = [
        (
            Window::<1>::builder().slots(0),
            "slots",
            ConfigErrorKind::OutOfRange,
            "slots must be within 1..=1024, got 0",
        ),
        (
            Window::<1>::builder().slots(1025),
            "slots",
            ConfigErrorKind::OutOfRange,
            "slots must be within 1..=1024, got 1025",
        ),
        (
            Window::<1>::builder().window(Duration::ZERO),
            "window",
            ConfigErrorKind::OutOfRange,
            "window must be more than zero, got 0ns",
        ),
        (
            Window::<1>::builder().window(Duration::from_secs(24 * 3600 + 1)),
            "window",
            ConfigErrorKind::OutOfRange,
            "window must be at most 24h, got 86401s",
        ),
        (
            Window::<1>::builder()
                .window(Duration::from_millis(10))
                .slots(11),
            "slots",
            ConfigErrorKind::Conflict,
            "window (10ms) divided by slots (11) must be at least 1ms, got 909.09µs",
        ),
        (
            Window::<1>::builder().stripes(3),
            "stripes",
            ConfigErrorKind::OutOfRange,
            "stripes must be a power of two within 1..=64, got 3",
        ),
        (
            Window::<1>::builder().stripes(128),
            "stripes",
            ConfigErrorKind::OutOfRange,
            "stripes must be a power of two within 1..=64, got 128",
        ),
        (
            Window::<1>::builder().stripes(0),
            "stripes",
            ConfigErrorKind::OutOfRange,
            "stripes must be a power of two within 1..=64, got 0",
        ),
    ];
    for (builder, field, kind, message) in cases {
        let e = builder.build().unwrap_err();
        assert_eq!((e.field(), e.kind()), (field, kind), "{e}");
        assert_eq!(e.to_string(), message);
    }
    // The bounds themselves.
    Window::<1>::builder()
        .window(Duration::from_secs(24 * 3600))
        .slots(1024)
        .stripes(64)
        .build()
        .unwrap();
    Window::<1>::builder()
        .window(Duration::from_millis(10))
        .slots(10)
        .stripes(1)
        .build()
        .unwrap();
}

#[test]
fn the_window_is_whole_slots_of_whole_nanoseconds() {
    let w = Window::<1>::builder()
        .window(Duration::from_nanos(10_000_000_007))
        .build()
        .unwrap();
    assert_eq!(w.slot_width(), Duration::from_secs(1));
    assert_eq!(w.window(), Duration::from_secs(10));
}

#[test]
fn slot_at_is_the_division_whatever_the_newest_slot() {
    let (w, _) = window::<1>(4, 1);
    for nanos in [0, 1, MS - 1, MS, 5 * MS + 3, u64::MAX] {
        assert_eq!(w.slot_at(nanos), nanos / MS);
    }
    w.add(7, 0, 1);
    for nanos in [0, 7 * MS - 1, 7 * MS, 8 * MS - 1, 8 * MS, u64::MAX] {
        assert_eq!(w.slot_at(nanos), nanos / MS, "{nanos}");
    }
}

#[test]
fn the_window_slides_one_slot_at_a_time() {
    let (w, clock) = window::<2>(4, 2);
    // Slot s gets s + 1 in counter 0 and 1 in counter 1.
    for s in 0..4u64 {
        let now = w.slot_now();
        assert_eq!(now, s);
        w.add(now, 0, u32::try_from(s + 1).unwrap());
        w.add(now, 1, 1);
        clock.advance(Duration::from_millis(1));
    }
    // Slot 4: slot 0 has left the window ending at 4.
    assert_eq!(w.counts(3).added_all(), &[1 + 2 + 3 + 4, 4]);
    assert_eq!(w.counts(4).added_all(), &[2 + 3 + 4, 3]);
    assert_eq!(w.counts(5).added_all(), &[3 + 4, 2]);
    assert_eq!(w.counts(7).added_all(), &[0, 0]);
    assert_eq!(w.slot_counts(2).added_all(), &[3, 1]);
    // A window near the start holds fewer slots.
    assert_eq!(w.counts(1).added_all(), &[1 + 2, 2]);
}

#[test]
fn a_reused_slot_starts_empty() {
    let (w, clock) = window::<1>(4, 1);
    w.add(w.slot_now(), 0, 7);
    // Exactly one ring later (4 slots rounded up to a ring of 4) the same cells serve slot 4.
    clock.advance(Duration::from_millis(4));
    w.add(w.slot_now(), 0, 1);
    assert_eq!(w.counts(4).added(0), 1);
    // Thousands of rings later, cells never written since are ignored.
    clock.advance(Duration::from_millis(4 * 1000 + 1));
    assert_eq!(w.counts(w.slot_now()).added(0), 0);
}

#[test]
fn a_ring_larger_than_the_window_keeps_old_slots_out() {
    // 3 slots in a ring of 4: slot 3 is in no window with slot 0, and slot 4 reuses 0's cells.
    let (w, clock) = window::<1>(3, 1);
    for s in 0..6u64 {
        w.add(w.slot_now(), 0, 1 << s);
        let expected: u64 = (s.saturating_sub(2)..=s).map(|k| 1 << k).sum();
        assert_eq!(w.counts(s).added(0), expected, "slot {s}");
        clock.advance(Duration::from_millis(1));
    }
}

#[test]
fn a_late_write_for_a_slot_that_left_every_window_is_dropped() {
    let (w, clock) = window::<1>(2, 1);
    let then = w.slot_now();
    clock.advance(Duration::from_millis(2));
    w.add(w.slot_now(), 0, 1); // slot 2 takes slot 0's cells
    w.add(then, 0, 5); // slot 0: gone
    assert_eq!(w.counts(2).added(0), 1);
}

#[test]
fn a_late_write_still_in_the_window_counts() {
    let (w, clock) = window::<1>(4, 1);
    let then = w.slot_now();
    clock.advance(Duration::from_millis(1));
    w.add(w.slot_now(), 0, 1);
    w.add(then, 0, 2);
    assert_eq!(w.counts(1).added(0), 3);
}

#[test]
fn counts_saturate_per_slot_and_stripe_and_sum_across_stripes() {
    let (w, _) = window::<1>(2, 2);
    for stripe in 0..2 {
        let c = w.cell(stripe, 0, 0);
        c.store(
            (u64::from(cell_tag(0)) << 32) | (u64::from(u32::MAX) - 1),
            Ordering::Relaxed,
        );
    }
    // This thread's stripe saturates; the other keeps its count; the sum holds both.
    for _ in 0..3 {
        w.add(0, 0, 1);
    }
    let mine = sync::thread_stripe() & w.stripe_mask;
    assert_eq!(cell::read(w.cell(mine, 0, 0), 0), u64::from(u32::MAX));
    assert_eq!(
        cell::read(w.cell(1 - mine, 0, 0), 0),
        u64::from(u32::MAX) - 1
    );
    assert_eq!(w.counts(0).added(0), 2 * u64::from(u32::MAX) - 1);
}

fn cell_tag(slot: u64) -> u32 {
    slot as u32
}

#[test]
fn slots_past_the_32_bit_tag_wrap() {
    let (w, _) = window::<1>(4, 1);
    let near = (1u64 << 32) - 2;
    for slot in near..near + 6 {
        w.add(slot, 0, 1);
        let expected = (slot - near + 1).min(4);
        assert_eq!(w.counts(slot).added(0), expected, "slot {slot}");
    }
}

#[test]
fn a_slot_idle_for_more_than_2_pow_31_slots_is_reset_not_ignored() {
    // Regression (of the histogram this window replaces): comparing tags on the bare
    // circle judged such a cell "newer" and dropped every write into it.
    let (w, _) = window::<1>(4, 1);
    let later = (1u64 << 31) + 10;
    w.add(later, 0, 3);
    assert_eq!(w.counts(later).added(0), 3);
}

#[test]
fn takes_are_exact_and_slide_with_the_window() {
    let (w, clock) = window::<1>(3, 2);
    let limit = at_most(2);
    assert!(w.try_take(w.slot_now(), &limit));
    assert!(w.try_take(w.slot_now(), &limit));
    assert!(!w.try_take(w.slot_now(), &limit), "two per window");
    // Slots 1 and 2: slot 0's takes still count.
    for _ in 0..2 {
        clock.advance(Duration::from_millis(1));
        assert!(!w.try_take(w.slot_now(), &limit));
        assert_eq!(w.counts(w.slot_now()).taken(), 2);
    }
    // Slot 3: slot 0 left.
    clock.advance(Duration::from_millis(1));
    assert_eq!(w.counts(w.slot_now()).taken(), 0);
    assert!(w.try_take(w.slot_now(), &limit));
    clock.advance(Duration::from_millis(1));
    assert!(w.try_take(w.slot_now(), &limit));
    assert!(!w.try_take(w.slot_now(), &limit));
    // The history: one take in slot 3, one in slot 4.
    assert_eq!(w.slot_counts(3).taken(), 1);
    assert_eq!(w.slot_counts(4).taken(), 1);
    assert_eq!(w.counts(5).taken(), 2);
    assert_eq!(w.counts(6).taken(), 1);
    assert_eq!(w.counts(7).taken(), 0);
}

#[test]
fn allow_sees_the_added_counts_and_the_takes() {
    let (w, _) = window::<2>(2, 2);
    w.add(0, 0, 5);
    w.add(0, 1, 2);
    let mut seen = None;
    assert!(w.try_take(0, |c| {
        seen = Some(*c);
        true
    }));
    assert_eq!(seen, Some(Counts::new([5, 2], 0)));
    assert_eq!(w.counts(0), Counts::new([5, 2], 1));
}

#[test]
fn a_late_caller_takes_in_the_heads_slot() {
    let (w, clock) = window::<1>(1, 1);
    let then = w.slot_now();
    clock.advance(Duration::from_millis(1));
    assert!(w.try_take(w.slot_now(), at_most(1)));
    // Read the clock in slot 0, but slot 1 already took: checked against slot 1's window.
    assert!(!w.try_take(then, at_most(1)));
    assert!(w.try_take(then, at_most(2)));
    assert_eq!(w.counts(1).taken(), 2);
    assert_eq!(w.counts(0).taken(), 0);
}

#[test]
fn a_slot_holds_at_most_taken_max() {
    let (w, _) = window::<1>(1, 1);
    w.head
        .0
        .store(cell::head(0, cell::TAKEN_MAX - 1), Ordering::Relaxed);
    assert!(w.try_take(0, |_| true));
    assert!(!w.try_take(0, |_| true));
    assert_eq!(w.counts(0).taken(), cell::TAKEN_MAX);
}

/// Regression: the retry budget's `Debug` called `remaining()`, which could move its window;
/// the budget's reads are now the window's, which only load.
#[test]
fn reads_change_nothing() {
    let (w, clock) = window::<1>(2, 1);
    w.add(0, 0, 1);
    assert!(w.try_take(0, |_| true));
    clock.advance(Duration::from_millis(5));
    let head = w.head.0.load(Ordering::Relaxed);
    let newest = w.newest();
    let now = w.slot_now();
    let _ = (w.counts(now), w.slot_counts(now), format!("{w:?}"));
    assert_eq!(w.head.0.load(Ordering::Relaxed), head);
    assert_eq!(w.newest(), newest);
    assert_eq!(w.counts(now).taken(), 0);
    assert_eq!(
        w.counts(1).taken(),
        1,
        "the head's own slot, read from the head"
    );
}

#[test]
fn late_writes_stay_out_of_a_window_that_moved_past_them() {
    // Two slots in a ring of two: slot 10's first write resets the cells of slots 9 and 10.
    let (w, _) = window::<1>(2, 1);
    w.add(10, 0, 1);
    // Slot 7's cells now belong to slot 9: a late write for 7 is dropped.
    w.add(7, 0, 1);
    assert_eq!(w.counts(10).added(0), 1);
    assert_eq!(w.counts(7).added(0), 0);
    // Slot 8 shares slot 10's cells: dropped too.
    w.add(8, 0, 1);
    assert_eq!(w.counts(10).added(0), 1);
    // Slot 9, late but still in the window ending at 10, counts.
    w.add(9, 0, 1);
    assert_eq!(w.counts(10).added(0), 2);
}

proptest::proptest! {
    /// Against a naive model (every add and take kept with its slot), for any geometry and
    /// any single-threaded sequence of adds and takes with gaps (including gaps longer than
    /// the window): every read counts exactly the events of its window, and takes never
    /// exceed their limit in any window.
    #[test]
    fn counts_match_a_naive_model(
        slots in 1u32..9,
        stripes in proptest::sample::select(vec![1u32, 2, 4]),
        limit in 0u64..6,
        events in proptest::collection::vec((0u64..40, 0usize..3, 1u32..4), 0..150),
        lookahead in 0u64..12,
    ) {
        let (w, _) = window::<2>(slots, stripes);
        let mut slot = 0u64;
        let mut model: Vec<(u64, usize, u64)> = Vec::new(); // (slot, 0/1 added or 2 taken, n)
        let in_window = |at: u64, s: u64| (at.saturating_sub(u64::from(slots) - 1)..=at).contains(&s);
        for (gap, op, n) in events {
            slot += if gap < 30 { gap / 10 } else { gap };
            if op < 2 {
                w.add(slot, op, n);
                model.push((slot, op, u64::from(n)));
            } else {
                let before: u64 = model
                    .iter()
                    .filter(|&&(s, k, _)| k == 2 && in_window(slot, s))
                    .map(|e| e.2)
                    .sum();
                let granted = w.try_take(slot, |c| c.taken() < limit);
                proptest::prop_assert_eq!(granted, before < limit);
                if granted {
                    model.push((slot, 2, 1));
                }
            }
            for at in [slot, slot + lookahead] {
                let mut expected = [0u64; 3];
                for &(s, k, n) in &model {
                    if in_window(at, s) {
                        expected[k] += n;
                    }
                }
                proptest::prop_assert_eq!(
                    w.counts(at),
                    Counts::new([expected[0], expected[1]], expected[2])
                );
                // One counter's sum is the same figure, read alone.
                proptest::prop_assert_eq!(w.added(at, 0), expected[0]);
                proptest::prop_assert_eq!(w.added(at, 1), expected[1]);
            }
        }
    }
}

#[test]
fn concurrent_adds_lose_nothing_across_stripes_and_slots() {
    let (w, clock) = window::<2>(8, 4);
    let w = Arc::new(w);
    std::thread::scope(|s| {
        for t in 0..4usize {
            let w = Arc::clone(&w);
            let clock = clock.clone();
            s.spawn(move || {
                for i in 0..20_000u32 {
                    if t == 0 && i % 5_000 == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                    w.add(w.slot_now(), t % 2, 1);
                }
            });
        }
    });
    // Four slot moves, all within the 8-slot window.
    assert_eq!(w.counts(w.slot_now()).added_all(), &[40_000, 40_000]);
}

#[test]
fn concurrent_takes_never_exceed_the_limit() {
    for round in 0..20u64 {
        let (w, _) = window::<1>(4, 2);
        let w = Arc::new(w);
        let granted = AtomicUsize::new(0);
        let limit = 100 + round;
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        if w.try_take(0, |c| c.taken() < limit) {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let granted = granted.load(Ordering::Relaxed) as u64;
        assert_eq!(granted, limit, "round {round}");
        assert_eq!(w.counts(0).taken(), limit);
    }
}

#[test]
fn concurrent_takes_across_slot_moves_never_exceed_the_limit_per_window() {
    // Eight slots (a ring of eight, so the history of every slot stays readable), the clock
    // moved seven times while four threads take: whatever the interleaving of takes and slot
    // moves, no window ends with more than its limit, and every granted take is in a slot.
    let (w, clock) = window::<1>(8, 2);
    let w = Arc::new(w);
    let granted = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..4 {
            let w = Arc::clone(&w);
            let clock = clock.clone();
            let granted = &granted;
            s.spawn(move || {
                for i in 1..=1_400 {
                    if t == 0 && i % 200 == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                    if w.try_take(w.slot_now(), |c| c.taken() < 20) {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(w.slot_now(), 7);
    for end in 0..=7 {
        assert!(w.counts(end).taken() <= 20, "window ending at {end}");
    }
    let per_slot: u64 = (0..=7).map(|s| w.slot_counts(s).taken()).sum();
    assert_eq!(per_slot, granted.load(Ordering::Relaxed) as u64);
    assert_eq!(
        per_slot, 20,
        "the 8-slot window is full from the first slot on"
    );
}
