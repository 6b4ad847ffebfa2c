//! The atomics of the adaptive limit's lock-free code: std's in a normal build, loom's under
//! `cfg(loom)`, so the model tests check the code that ships.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
