//! The shape of the outage experiment: which runs it makes and how long each phase lasts.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::report::Phases;
use crate::strategy::Strategy;

/// The server's middleware, as `demo-server --stack` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerStack {
    /// The rate limiter and the overload signal layer in front of the handler.
    Full,
    /// The adaptive concurrency limit (no rate configured) and the overload signal layer
    /// in front of the handler.
    Adaptive,
    /// The deadline layer alone in front of the handler: no rate, no limit; requests whose
    /// callers' deadline has passed are answered `504` at once.
    Deadline,
    /// The bare handler.
    None,
}

impl ServerStack {
    /// The name `demo-server --stack` takes.
    pub const fn name(self) -> &'static str {
        match self {
            ServerStack::Full => "full",
            ServerStack::Adaptive => "adaptive",
            ServerStack::Deadline => "deadline",
            ServerStack::None => "none",
        }
    }
}

/// One run of the experiment: a client strategy against a server stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunSpec {
    /// How the clients retry.
    pub strategy: Strategy,
    /// What the server runs in front of its handler.
    pub stack: ServerStack,
}

impl RunSpec {
    /// The runs of a default scenario, in order: `fixed` and `exponential` against the bare
    /// server (the article's two clients), `full` against the bare server (what the client
    /// stack achieves alone), `full` against the full server stack (both), and `fixed`
    /// against the full server stack (what the server side achieves alone, with clients that
    /// know nothing of it). Five runs of 95 s: about 8 minutes.
    pub const DEFAULT: [RunSpec; 5] = [
        RunSpec {
            strategy: Strategy::Fixed,
            stack: ServerStack::None,
        },
        RunSpec {
            strategy: Strategy::Exponential,
            stack: ServerStack::None,
        },
        RunSpec {
            strategy: Strategy::Full,
            stack: ServerStack::None,
        },
        RunSpec {
            strategy: Strategy::Full,
            stack: ServerStack::Full,
        },
        RunSpec {
            strategy: Strategy::Fixed,
            stack: ServerStack::Full,
        },
    ];

    /// The label of the run in tables and plots, such as `fixed vs --stack none`.
    pub fn label(&self) -> String {
        format!("{} vs --stack {}", self.strategy, self.stack.name())
    }
}

impl fmt::Display for RunSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.strategy, self.stack.name())
    }
}

/// A run written as `STRATEGY:STACK` could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRunSpec(String);

impl fmt::Display for InvalidRunSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid run {:?}: write it as STRATEGY:STACK, with a strategy of fixed, exponential, exponential-program, full, full-no-throttle, full-reqwest or reqwest-default and a stack of full, adaptive, deadline or none (e.g. fixed:none)",
            self.0
        )
    }
}

impl std::error::Error for InvalidRunSpec {}

impl FromStr for RunSpec {
    type Err = InvalidRunSpec;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidRunSpec(s.to_owned());
        let (strategy, stack) = s.split_once(':').ok_or_else(invalid)?;
        let strategy = strategy.parse::<Strategy>().map_err(|_| invalid())?;
        let stack = match stack {
            "full" => ServerStack::Full,
            "adaptive" => ServerStack::Adaptive,
            "deadline" => ServerStack::Deadline,
            "none" => ServerStack::None,
            _ => return Err(invalid()),
        };
        Ok(RunSpec { strategy, stack })
    }
}

/// Why a [`Timing`] could not be built.
///
/// The rules: every phase is a whole number of seconds (the figures are per second); the
/// steady state lasts at least 2 s (the baseline leaves out a warm-up second); the pause at
/// least 1 s; the observation at least 10 s (one recovery window, see
/// [`RecoveryCriteria`](crate::report::RecoveryCriteria)); and the whole run at most a day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidTiming(&'static str);

impl fmt::Display for InvalidTiming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for InvalidTiming {}

/// How long each phase of a run lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    phases: Phases,
}

impl Timing {
    /// The article's timing: 15 s of steady state, a 20 s pause, 60 s of observation.
    pub const DEFAULT: Timing = Timing {
        phases: Phases {
            pause_at: 15,
            pause_for: 20,
            observe_for: 60,
        },
    };

    /// The `--quick` timing: 3 s steady, 8 s paused, 10 s observed; the five default runs
    /// take about 110 s.
    ///
    /// The pause is the shortest that still shows the article's result with its load (1000
    /// clients, 10 s think time, 2 s timeout): fixed-interval clients queue about 2000
    /// attempts in 8 s, twice the concurrency (951) at which the article's model takes
    /// longer than the clients' timeout. A 5 s pause queues about 700, and a bare server
    /// recovers from that.
    pub const QUICK: Timing = Timing {
        phases: Phases {
            pause_at: 3,
            pause_for: 8,
            observe_for: 10,
        },
    };

    /// Validates the phases; see [`InvalidTiming`] for the rules.
    pub fn new(
        steady: Duration,
        pause: Duration,
        observe: Duration,
    ) -> Result<Self, InvalidTiming> {
        let whole = |d: Duration, what| {
            if d.subsec_nanos() != 0 {
                Err(InvalidTiming(what))
            } else {
                usize::try_from(d.as_secs()).map_err(|_| InvalidTiming("the run is too long"))
            }
        };
        let steady = whole(steady, "the steady state must be a whole number of seconds")?;
        let pause = whole(pause, "the pause must be a whole number of seconds")?;
        let observe = whole(observe, "the observation must be a whole number of seconds")?;
        if steady < 2 {
            return Err(InvalidTiming("the steady state must last at least 2s"));
        }
        if pause < 1 {
            return Err(InvalidTiming("the pause must last at least 1s"));
        }
        if observe < 10 {
            return Err(InvalidTiming("the observation must last at least 10s"));
        }
        if steady + pause + observe > 86_400 {
            return Err(InvalidTiming("the run is too long: at most a day"));
        }
        Ok(Self {
            phases: Phases {
                pause_at: steady,
                pause_for: pause,
                observe_for: observe,
            },
        })
    }

    /// The phases from whole seconds, in a constant: `None` where [`Timing::new`] would
    /// refuse them.
    pub const fn from_secs(steady: usize, pause: usize, observe: usize) -> Option<Self> {
        if steady < 2 || pause < 1 || observe < 10 || steady + pause + observe > 86_400 {
            return None;
        }
        Some(Self {
            phases: Phases {
                pause_at: steady,
                pause_for: pause,
                observe_for: observe,
            },
        })
    }

    /// The phases in whole seconds.
    pub const fn phases(&self) -> Phases {
        self.phases
    }

    /// The steady state.
    pub const fn steady(&self) -> Duration {
        Duration::from_secs(self.phases.pause_at as u64)
    }

    /// The pause.
    pub const fn pause(&self) -> Duration {
        Duration::from_secs(self.phases.pause_for as u64)
    }

    /// The observation after resume.
    pub const fn observe(&self) -> Duration {
        Duration::from_secs(self.phases.observe_for as u64)
    }

    /// The whole run.
    pub const fn total(&self) -> Duration {
        Duration::from_secs(self.phases.end() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_specs_parse() {
        assert_eq!(
            "fixed:none".parse::<RunSpec>(),
            Ok(RunSpec {
                strategy: Strategy::Fixed,
                stack: ServerStack::None
            })
        );
        for spec in RunSpec::DEFAULT {
            assert_eq!(spec.to_string().parse::<RunSpec>(), Ok(spec));
        }
        assert_eq!(
            "fixed:adaptive".parse::<RunSpec>(),
            Ok(RunSpec {
                strategy: Strategy::Fixed,
                stack: ServerStack::Adaptive
            })
        );
        let deadline = "full:deadline".parse::<RunSpec>().unwrap();
        assert_eq!(
            deadline,
            RunSpec {
                strategy: Strategy::Full,
                stack: ServerStack::Deadline
            }
        );
        assert_eq!(deadline.label(), "full vs --stack deadline");
        for bad in [
            "fixed",
            "fixed:",
            ":none",
            "fixed:half",
            "slow:full",
            "full:full:x",
        ] {
            let err = bad.parse::<RunSpec>().unwrap_err();
            assert!(err.to_string().contains("STRATEGY:STACK"), "{bad}: {err}");
        }
        assert_eq!(RunSpec::DEFAULT[2].label(), "full vs --stack none");
        assert_eq!(RunSpec::DEFAULT[3].label(), "full vs --stack full");
        assert_eq!(RunSpec::DEFAULT[4].label(), "fixed vs --stack full");
        assert_eq!(
            "exponential-program:none".parse::<RunSpec>(),
            Ok(RunSpec {
                strategy: Strategy::ExponentialProgram,
                stack: ServerStack::None
            })
        );
    }

    #[test]
    fn timing_rules() {
        let s = Duration::from_secs;
        assert_eq!(Timing::new(s(15), s(20), s(60)), Ok(Timing::DEFAULT));
        assert_eq!(Timing::DEFAULT.total(), s(95));
        // Five quick runs of 21 s: 105 s, servers' startup aside.
        assert_eq!(Timing::QUICK.total() * 5, s(105));
        assert!(Timing::new(Duration::from_millis(1500), s(1), s(10)).is_err());
        assert!(Timing::new(s(1), s(1), s(10)).is_err());
        assert!(Timing::new(s(2), s(0), s(10)).is_err());
        assert!(Timing::new(s(2), s(1), s(9)).is_err());
        assert!(Timing::new(s(2), s(1), s(86_400)).is_err());
        let t = Timing::new(s(2), s(1), s(10)).unwrap();
        assert_eq!((t.steady(), t.pause(), t.observe()), (s(2), s(1), s(10)));
        let err = Timing::new(s(2), Duration::from_millis(500), s(10)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the pause must be a whole number of seconds"
        );
    }
}
