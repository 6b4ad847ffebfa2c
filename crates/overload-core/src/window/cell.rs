//! The packed words a window is made of, and the only code that reads or writes them.
//!
//! A **cell** counts for one slot: its high 32 bits are the slot's number modulo 2^32 (its
//! tag), its low 32 bits the count, which saturates. Resetting a cell that still holds an
//! older slot and counting in it are one compare-and-swap, so a reset can never lose a
//! concurrent write.
//!
//! The **head** holds the slot of the window's takes (high 40 bits, modulo 2^40) and the
//! takes in it (low 24 bits, at most [`TAKEN_MAX`]); every take is a compare-and-swap on it.

use crate::sync::{AtomicU64, Ordering};

/// The largest count of a cell: `u32::MAX`.
pub(super) const COUNT_MAX: u64 = u32::MAX as u64;

/// The most takes one slot can hold: 2^24 - 1 (16,777,215).
pub(super) const TAKEN_MAX: u64 = (1 << HEAD_TAKEN_BITS) - 1;

const HEAD_TAKEN_BITS: u32 = 24;
const HEAD_SLOT_MASK: u64 = (1 << (64 - HEAD_TAKEN_BITS)) - 1;

const fn tag_of(slot: u64) -> u32 {
    slot as u32
}

const fn tag(word: u64) -> u32 {
    (word >> 32) as u32
}

const fn count(word: u64) -> u64 {
    word & COUNT_MAX
}

const fn pack(tag: u32, count: u64) -> u64 {
    ((tag as u64) << 32) | count
}

/// Where a cell stands against the slot we are about to write for.
enum Age {
    /// It counts for our slot.
    Same,
    /// It counts for an older slot, which has left the window: reset it.
    Stale,
    /// It counts for a newer slot, `by` slots ahead of ours (if the tag is taken at face
    /// value: a tag more than half the circle old also reads as ahead).
    Ahead { by: u32 },
}

const fn age(cell: u32, ours: u32) -> Age {
    let behind = ours.wrapping_sub(cell);
    if behind == 0 {
        Age::Same
    } else if behind < 1 << 31 {
        Age::Stale
    } else {
        Age::Ahead {
            by: cell.wrapping_sub(ours),
        }
    }
}

/// Whether a cell `by` slots ahead of `slot` really is ahead: a slot no write has reached
/// (beyond `newest`) is not, so the tag is in fact more than half the circle old.
// NOTE: every write raises `newest` to its slot before it writes a cell (release), and the
// cell is read with acquire, so a legitimate tag is never beyond the `newest` read after it.
fn really_ahead(slot: u64, by: u32, newest: impl FnOnce() -> u64) -> bool {
    slot.saturating_add(u64::from(by)) <= newest()
}

/// The count `cell` holds for `slot`: 0 if it holds another slot.
#[inline]
pub(super) fn read(cell: &AtomicU64, slot: u64) -> u64 {
    let word = cell.load(Ordering::Relaxed);
    if tag(word) == tag_of(slot) {
        count(word)
    } else {
        0
    }
}

/// Adds `n` to `cell` for `slot`, saturating. Returns the compare-and-swap rounds it took:
/// one, plus one per write another thread made to the same cell meanwhile.
///
/// A cell that holds an older slot is reset and counted in one step; a cell that a newer
/// slot already took means our slot has left the window (we read the clock before a thread
/// that has since moved on): the write is dropped.
#[inline]
pub(super) fn add(cell: &AtomicU64, slot: u64, n: u64, newest: impl Fn() -> u64) -> u32 {
    let ours = tag_of(slot);
    let n = n.min(COUNT_MAX);
    let mut word = cell.load(Ordering::Acquire);
    let mut rounds = 1;
    loop {
        let next = match age(tag(word), ours) {
            Age::Same => {
                let now = count(word);
                if now == COUNT_MAX {
                    return rounds; // saturated
                }
                pack(ours, now.saturating_add(n).min(COUNT_MAX))
            }
            Age::Stale => pack(ours, n),
            Age::Ahead { by } if really_ahead(slot, by, &newest) => return rounds,
            Age::Ahead { .. } => pack(ours, n),
        };
        match cell.compare_exchange_weak(word, next, Ordering::Release, Ordering::Acquire) {
            Ok(_) => return rounds,
            Err(actual) => {
                word = actual;
                rounds += 1;
            }
        }
    }
}

/// Resets `cell` to an empty count for `slot` if it holds an older slot; leaves it alone
/// otherwise. Used when a new slot begins, so that no cell keeps a count long enough for
/// its 32-bit tag to come round again.
pub(super) fn expire(cell: &AtomicU64, slot: u64, newest: impl Fn() -> u64) {
    let ours = tag_of(slot);
    let mut word = cell.load(Ordering::Acquire);
    loop {
        match age(tag(word), ours) {
            Age::Same => return,
            Age::Ahead { by } if really_ahead(slot, by, &newest) => return,
            Age::Stale | Age::Ahead { .. } => {}
        }
        match cell.compare_exchange_weak(word, pack(ours, 0), Ordering::Release, Ordering::Acquire)
        {
            Ok(_) => return,
            Err(actual) => word = actual,
        }
    }
}

/// Raises `cell` to at least `value` for `slot`: the takes of a slot the head has left.
/// Several threads may record the same slot (each that moves the head, or tries to);
/// they all write the final count or less, so the largest is the final count.
///
/// A cell holding an older slot is overwritten. A cell holding a newer slot is left alone:
/// the recording thread loaded the head long ago and the head has since been through that
/// newer slot, whose record a window may still need.
pub(super) fn raise(cell: &AtomicU64, slot: u64, value: u64, newest: impl Fn() -> u64) {
    let ours = tag_of(slot);
    let value = value.min(COUNT_MAX);
    let mut word = cell.load(Ordering::Acquire);
    loop {
        match age(tag(word), ours) {
            Age::Same if count(word) >= value => return,
            Age::Ahead { by } if really_ahead(slot, by, &newest) => return,
            Age::Same | Age::Stale | Age::Ahead { .. } => {}
        }
        match cell.compare_exchange_weak(
            word,
            pack(ours, value),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => return,
            Err(actual) => word = actual,
        }
    }
}

/// A head word: `taken` takes in `slot`.
pub(super) const fn head(slot: u64, taken: u64) -> u64 {
    ((slot & HEAD_SLOT_MASK) << HEAD_TAKEN_BITS) | taken
}

/// The takes a head word holds.
pub(super) const fn head_taken(word: u64) -> u64 {
    word & TAKEN_MAX
}

/// The full slot number of a head word, read near `near`; `newest` is the newest slot any
/// write has reached.
///
/// The head keeps 40 bits of its slot. A head ahead of `near` (a late caller) is ahead by
/// less than half of that circle and never beyond `newest`; anything else is behind.
pub(super) fn head_slot(word: u64, near: u64, newest: u64) -> u64 {
    let theirs = word >> HEAD_TAKEN_BITS;
    let ahead = theirs.wrapping_sub(near) & HEAD_SLOT_MASK;
    if ahead == 0 {
        return near;
    }
    if ahead < 1 << 39 {
        let slot = near.saturating_add(ahead);
        if slot <= newest {
            return slot;
        }
    }
    let behind = near.wrapping_sub(theirs) & HEAD_SLOT_MASK;
    // NOTE: a head judged "ahead" beyond `newest` is more than half the circle old: `behind`
    // is then at least 2^39, far outside any window, which is all that matters to callers.
    near.saturating_sub(behind.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing() {
        assert_eq!(tag(pack(7, 9)), 7);
        assert_eq!(count(pack(7, 9)), 9);
        assert_eq!(tag(pack(u32::MAX, COUNT_MAX)), u32::MAX);
        assert_eq!(count(pack(u32::MAX, COUNT_MAX)), COUNT_MAX);
        assert_eq!(tag_of((1 << 32) + 5), 5);
    }

    #[test]
    fn ages_on_the_wrapping_circle() {
        assert!(matches!(age(5, 5), Age::Same));
        assert!(matches!(age(4, 5), Age::Stale));
        assert!(matches!(age(6, 5), Age::Ahead { by: 1 }));
        // Across the wrap.
        assert!(matches!(age(u32::MAX, 0), Age::Stale));
        assert!(matches!(age(0, u32::MAX), Age::Ahead { by: 1 }));
    }

    #[test]
    fn add_resets_stale_drops_late_and_saturates() {
        let cell = AtomicU64::new(pack(3, 40));
        assert_eq!(add(&cell, 3, 2, || 3), 1);
        assert_eq!(read(&cell, 3), 42);
        // Slot 13 reuses the cell: the old count goes.
        add(&cell, 13, 1, || 13);
        assert_eq!(read(&cell, 13), 1);
        assert_eq!(read(&cell, 3), 0);
        // A late write for slot 3: dropped.
        add(&cell, 3, 5, || 13);
        assert_eq!(read(&cell, 13), 1);
        // Saturation.
        let cell = AtomicU64::new(pack(1, COUNT_MAX - 1));
        add(&cell, 1, 10, || 1);
        assert_eq!(read(&cell, 1), COUNT_MAX);
        add(&cell, 1, 1, || 1);
        assert_eq!(read(&cell, 1), COUNT_MAX);
    }

    #[test]
    fn a_tag_more_than_half_the_circle_old_is_stale_not_ahead() {
        // Regression (of the histogram before the window): comparing tags on the bare
        // circle judged such a cell "newer" and dropped every write into it.
        let slot = (1u64 << 31) + 10;
        let cell = AtomicU64::new(pack(0, 7));
        add(&cell, slot, 1, || slot);
        assert_eq!(read(&cell, slot), 1);
        let cell = AtomicU64::new(pack(0, 7));
        expire(&cell, slot, || slot);
        assert_eq!(read(&cell, slot), 0);
        assert_eq!(tag(cell.load(Ordering::Relaxed)), tag_of(slot));
    }

    #[test]
    fn expire_resets_only_older_slots() {
        let cell = AtomicU64::new(pack(2, 9));
        expire(&cell, 2, || 2);
        assert_eq!(read(&cell, 2), 9);
        expire(&cell, 12, || 12);
        assert_eq!(read(&cell, 12), 0);
        assert_eq!(read(&cell, 2), 0);
        // A newer slot's count stays.
        add(&cell, 22, 4, || 22);
        expire(&cell, 12, || 22);
        assert_eq!(read(&cell, 22), 4);
    }

    #[test]
    fn raise_keeps_the_largest_and_overwrites_older_slots() {
        let cell = AtomicU64::new(0);
        raise(&cell, 4, 3, || 4);
        raise(&cell, 4, 2, || 4);
        assert_eq!(read(&cell, 4), 3);
        raise(&cell, 4, 5, || 4);
        assert_eq!(read(&cell, 4), 5);
        raise(&cell, 14, 1, || 14);
        assert_eq!(read(&cell, 14), 1);
        // A late record for slot 4 leaves slot 14's alone.
        raise(&cell, 4, 9, || 15);
        assert_eq!(read(&cell, 14), 1);
        // A cell more than half the circle old is overwritten, not taken for a newer one.
        let slot = (1u64 << 31) + 10;
        raise(&cell, slot, 2, || slot);
        assert_eq!(read(&cell, slot), 2);
    }

    #[test]
    fn head_words() {
        let w = head(12, 3);
        assert_eq!(head_taken(w), 3);
        assert_eq!(head_slot(w, 12, 12), 12);
        // Read by a later caller: behind.
        assert_eq!(head_slot(w, 20, 20), 12);
        // Read by a late caller (slot 10) while slot 12 has been written: ahead.
        assert_eq!(head_slot(w, 10, 12), 12);
        // "Ahead" beyond every write: in fact ancient, far behind.
        assert_eq!(head_slot(w, 10, 11), 0);
        // Slot 5 read from 2^41 + 3: the latest slot with those 40 bits, 2^40 + 5.
        let near = (1u64 << 41) + 3;
        assert_eq!(head_slot(head(5, 0), near, near), (1 << 40) + 5);
        // Across the 40-bit wrap.
        let far = (1u64 << 40) + 7;
        assert_eq!(head_slot(head(far, 1), far + 3, far + 3), far);
        assert_eq!(head_slot(head(far, 1), far - 2, far), far);
        assert_eq!(head_taken(head(far, TAKEN_MAX)), TAKEN_MAX);
    }
}
