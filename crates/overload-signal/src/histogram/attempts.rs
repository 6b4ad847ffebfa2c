//! The classes a request's attempt counter falls into.

use crate::protocol::Attempt;

/// The class a request's attempt counter falls into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptClass {
    /// `X-Request-Attempt: 0`: a first try.
    First,
    /// `1`: the first retry.
    Retry1,
    /// `2`: the second retry.
    Retry2,
    /// `3` or more.
    Retry3OrMore,
    /// No counter was sent: not counted as a retry.
    Unknown,
    /// The counter could not be read: treated as unknown, counted apart.
    Malformed,
}

impl AttemptClass {
    /// Every class, in the order of their [`label`](AttemptClass::label)s.
    pub const ALL: [AttemptClass; 6] = [
        AttemptClass::First,
        AttemptClass::Retry1,
        AttemptClass::Retry2,
        AttemptClass::Retry3OrMore,
        AttemptClass::Unknown,
        AttemptClass::Malformed,
    ];

    /// The class of an attempt counter.
    pub const fn of(attempt: Attempt) -> Self {
        match attempt {
            Attempt::Number(0) => AttemptClass::First,
            Attempt::Number(1) => AttemptClass::Retry1,
            Attempt::Number(2) => AttemptClass::Retry2,
            Attempt::Number(_) => AttemptClass::Retry3OrMore,
            Attempt::Unknown => AttemptClass::Unknown,
            Attempt::Malformed => AttemptClass::Malformed,
        }
    }

    /// Whether requests of this class are known retries.
    pub const fn is_retry(self) -> bool {
        matches!(
            self,
            AttemptClass::Retry1 | AttemptClass::Retry2 | AttemptClass::Retry3OrMore
        )
    }

    /// The metric label of this class: `"0"`, `"1"`, `"2"`, `"3+"`, `"unknown"`,
    /// `"malformed"`.
    pub const fn label(self) -> &'static str {
        match self {
            AttemptClass::First => "0",
            AttemptClass::Retry1 => "1",
            AttemptClass::Retry2 => "2",
            AttemptClass::Retry3OrMore => "3+",
            AttemptClass::Unknown => "unknown",
            AttemptClass::Malformed => "malformed",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl From<Attempt> for AttemptClass {
    fn from(attempt: Attempt) -> Self {
        Self::of(attempt)
    }
}
