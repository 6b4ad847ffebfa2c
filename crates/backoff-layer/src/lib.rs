//! A Tower retry layer that does not cause retry storms.

pub mod backoff;
pub mod budget;
