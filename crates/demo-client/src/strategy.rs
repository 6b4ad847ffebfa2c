//! The client retry strategies the experiment compares.

use std::fmt;
use std::str::FromStr;

/// How a demo client retries a failed attempt.
///
/// `fixed`, `exponential` and `exponential-program` are the article's clients, built on
/// [`NaiveRetry`](crate::client::NaiveRetry); `full` and `full-no-throttle` are
/// `backoff-layer`'s retry layer. See [`stack`](crate::stack) for each configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The article's simulation client: retries every failure (a refused connection, a
    /// timed-out attempt, any status but `2xx`) 100 ms after it, without end. It sends no
    /// `X-Request-Attempt` header and retries the stop signal like any other failure: the
    /// strategy that keeps a resumed server down.
    Fixed,
    /// The article's exponential client, as its pseudo-code has it: the same, with the
    /// article's exponential backoff between attempts (100 ms, x2, normal jitter 0.1, at
    /// most 15 minutes) and nothing else.
    Exponential,
    /// The exponential client of the article's program: its backoff grows from the think
    /// time it just slept (x2.7, normal jitter 0.1 fed back, at most 10 minutes), so its
    /// first retry waits about 27 s. See
    /// [`CarriedDelay`](crate::client::CarriedDelay).
    ExponentialProgram,
    /// Everything this workspace offers: the article's exponential backoff with jitter, a
    /// retry budget, at most 3 attempts, the `X-Request-Attempt` header, no retry after a
    /// stop signal, and the client-side throttle.
    Full,
    /// `full` without the client-side throttle (`RetryBuilder::no_throttle`): the client
    /// stack before it existed, for comparison.
    FullNoThrottle,
    /// `full` over a `reqwest::Client` instead of hyper-util's (the `reqwest` feature:
    /// [`client::reqwest_transport`](crate::client)): the same retry layer, for a row
    /// through reqwest. Real network runs only; the simulation refuses it.
    FullReqwest,
    /// A `reqwest::Client` retrying on its own (the `reqwest` feature:
    /// `client::reqwest_default_transport`), under no retry layer of ours: reqwest 0.13's
    /// retry policy with its defaults (at most 2 retries, a 20 % budget over 10 s, no wait
    /// between attempts), retrying what `full` retries. No attempt header, no deadline, no
    /// stop signal, no throttle. Real network runs only; the simulation refuses it.
    ReqwestDefault,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 7] = [
        Strategy::Fixed,
        Strategy::Exponential,
        Strategy::ExponentialProgram,
        Strategy::Full,
        Strategy::FullNoThrottle,
        Strategy::FullReqwest,
        Strategy::ReqwestDefault,
    ];

    /// The name used on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Fixed => "fixed",
            Strategy::Exponential => "exponential",
            Strategy::ExponentialProgram => "exponential-program",
            Strategy::Full => "full",
            Strategy::FullNoThrottle => "full-no-throttle",
            Strategy::FullReqwest => "full-reqwest",
            Strategy::ReqwestDefault => "reqwest-default",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A strategy name that is not one of [`Strategy::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStrategy(String);

impl fmt::Display for UnknownStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown strategy {:?}: expected fixed, exponential, exponential-program, full, \
             full-no-throttle, full-reqwest or reqwest-default",
            self.0
        )
    }
}

impl std::error::Error for UnknownStrategy {}

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>(), Ok(s));
        }
        let err = "Full".parse::<Strategy>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown strategy \"Full\": expected fixed, exponential, exponential-program, full, \
             full-no-throttle, full-reqwest or reqwest-default"
        );
    }
}
