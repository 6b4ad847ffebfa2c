//! A Tower retry layer that does not cause retry storms.
//!
//! This crate is being built; today it holds only the [`budget::Budget`] contract that the
//! retry layer and the retry budget share. See the workspace README for the plan.

pub mod budget;
