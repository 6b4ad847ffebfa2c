//! Driving one run through its phases: steady state, pause, resume, observation, with a
//! progress line and a pause that is always undone.

use std::io::{self, IsTerminal, Write};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::experiment::Timing;
use crate::process::Pausable;
use crate::record::Recorder;

/// Something the experiment can freeze and resume: a process, or the simulated server.
pub trait Pause {
    /// Freezes it.
    fn pause(&self) -> io::Result<()>;
    /// Resumes it.
    fn resume(&self) -> io::Result<()>;
}

impl Pause for Pausable {
    fn pause(&self) -> io::Result<()> {
        Pausable::pause(self)
    }

    fn resume(&self) -> io::Result<()> {
        Pausable::resume(self)
    }
}

/// Holds a [`Pause`] and resumes it when dropped if it is still paused, so that no exit path
/// (an error, a panic, a Ctrl-C that drops the run) leaves a server frozen.
#[derive(Debug)]
pub struct PauseGuard<P: Pause> {
    target: P,
    paused: bool,
}

impl<P: Pause> PauseGuard<P> {
    /// Guards `target`, which is running.
    pub const fn new(target: P) -> Self {
        Self {
            target,
            paused: false,
        }
    }

    /// Pauses the target.
    pub fn pause(&mut self) -> io::Result<()> {
        self.target.pause()?;
        self.paused = true;
        Ok(())
    }

    /// Resumes the target.
    pub fn resume(&mut self) -> io::Result<()> {
        self.target.resume()?;
        self.paused = false;
        Ok(())
    }

    /// Whether the target is paused.
    pub const fn is_paused(&self) -> bool {
        self.paused
    }
}

impl<P: Pause> Drop for PauseGuard<P> {
    fn drop(&mut self) {
        if self.paused {
            let _ = self.target.resume();
        }
    }
}

/// A one-line progress indicator on standard error: the run, its phase, the time left in
/// it, and the last second's successes and timeouts. On a terminal the line is redrawn in
/// place every second; otherwise one line is written per phase.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    terminal: bool,
    prefix: String,
    last_phase: &'static str,
}

impl Progress {
    /// A progress indicator; `enabled = false` makes it silent (for tests).
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            terminal: io::stderr().is_terminal(),
            prefix: String::new(),
            last_phase: "",
        }
    }

    /// Starts a new run, labelled `[index/total] label`.
    pub fn start_run(&mut self, index: usize, total: usize, label: &str) {
        self.prefix = format!("[{index}/{total}] {label}");
        self.last_phase = "";
    }

    fn update(&mut self, phase: &'static str, left: Duration, ok: u64, timeouts: u64) {
        if !self.enabled {
            return;
        }
        let mut err = io::stderr().lock();
        if self.terminal {
            let _ = write!(
                err,
                "\r\x1b[2K{}: {phase}, {:>3} s left | OK {ok}/s, timed out {timeouts}/s",
                self.prefix,
                whole_seconds(left)
            );
            let _ = err.flush();
        } else if phase != self.last_phase {
            let _ = writeln!(
                err,
                "{}: {phase} for {} s",
                self.prefix,
                whole_seconds(left)
            );
        }
        self.last_phase = phase;
    }

    /// Ends the current line.
    pub fn finish_run(&mut self) {
        if self.enabled && self.terminal {
            let _ = writeln!(io::stderr());
        }
    }
}

/// `d` in whole seconds, rounded to the nearest: a phase of 15 s that starts a few
/// milliseconds late still reads "15 s", not "14 s".
fn whole_seconds(d: Duration) -> u64 {
    (d + Duration::from_millis(500)).as_secs()
}

/// Runs the phases of `timing` from `start` (the recorder's second 0): waits out the steady
/// state, pauses `target`, waits out the pause, resumes it, and waits out the observation,
/// updating `progress` every second.
pub async fn drive_phases<P: Pause>(
    recorder: &Recorder,
    timing: Timing,
    target: &mut PauseGuard<P>,
    progress: &mut Progress,
) -> io::Result<()> {
    let start = recorder.start();
    let pause_at = start + timing.steady();
    let resume_at = pause_at + timing.pause();
    let end = resume_at + timing.observe();
    let mut tick = start;
    loop {
        let now = Instant::now();
        if now >= pause_at && now < resume_at && !target.is_paused() {
            target.pause()?;
        }
        if now >= resume_at && target.is_paused() {
            target.resume()?;
        }
        if now >= end {
            return Ok(());
        }
        let (phase, phase_end) = if now < pause_at {
            ("steady state", pause_at)
        } else if now < resume_at {
            ("paused", resume_at)
        } else {
            ("observing after resume", end)
        };
        let second = usize::try_from(now.saturating_duration_since(start).as_secs())
            .unwrap_or(usize::MAX)
            .saturating_sub(1);
        let last = recorder.totals(second, second + 1);
        progress.update(phase, phase_end - now, last.ok, last.timeouts);
        tick += Duration::from_secs(1);
        // Wake at the next whole second or the next phase change, whichever is first, so
        // the pause and the resume happen on the second.
        let next = [tick, pause_at, resume_at, end]
            .into_iter()
            .filter(|t| *t > now)
            .min()
            .unwrap_or(end);
        sleep_until(next).await;
    }
}

/// Reads a gauge from a Prometheus text exposition: the sum of every sample of metric
/// `name` (across label sets), rounded down; `None` if the metric is absent.
pub fn parse_gauge(text: &str, name: &str) -> Option<u64> {
    let mut total: Option<f64> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // The metric name must end here: `name value` or `name{labels} value`.
        let rest = if let Some(labelled) = rest.strip_prefix('{') {
            match labelled.split_once('}') {
                Some((_, after)) => after,
                None => continue,
            }
        } else if rest.starts_with([' ', '\t']) {
            rest
        } else {
            continue;
        };
        if let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
        {
            *total.get_or_insert(0.0) += value;
        }
    }
    total.map(|t| t as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Debug, Clone, Default)]
    struct Log(Arc<Mutex<Vec<(&'static str, Duration)>>>, Option<Instant>);

    impl Pause for Log {
        fn pause(&self) -> io::Result<()> {
            let at = Instant::now() - self.1.unwrap();
            self.0.lock().unwrap().push(("pause", at));
            Ok(())
        }
        fn resume(&self) -> io::Result<()> {
            let at = Instant::now() - self.1.unwrap();
            self.0.lock().unwrap().push(("resume", at));
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn phases_happen_on_time() {
        let recorder = Recorder::new();
        let log = Log(Arc::default(), Some(recorder.start()));
        let events = Arc::clone(&log.0);
        let mut guard = PauseGuard::new(log);
        let timing = Timing::new(
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::from_secs(10),
        )
        .unwrap();
        drive_phases(&recorder, timing, &mut guard, &mut Progress::new(false))
            .await
            .unwrap();
        assert_eq!(
            *events.lock().unwrap(),
            vec![
                ("pause", Duration::from_secs(3)),
                ("resume", Duration::from_secs(5))
            ]
        );
        assert_eq!(Instant::now() - recorder.start(), Duration::from_secs(15));
        assert!(!guard.is_paused());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_run_resumes_the_target() {
        let recorder = Recorder::new();
        let log = Log(Arc::default(), Some(recorder.start()));
        let events = Arc::clone(&log.0);
        let mut guard = PauseGuard::new(log);
        let timing = Timing::DEFAULT;
        // Interrupt the run in the middle of the pause, as Ctrl-C would.
        let _ = tokio::time::timeout(
            Duration::from_secs(20),
            drive_phases(&recorder, timing, &mut guard, &mut Progress::new(false)),
        )
        .await;
        assert!(guard.is_paused());
        drop(guard);
        let events = events.lock().unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1], ("resume", Duration::from_secs(20)));
    }

    #[test]
    fn seconds_left_are_not_one_short() {
        assert_eq!(whole_seconds(Duration::from_millis(14_996)), 15);
        assert_eq!(whole_seconds(Duration::from_secs(15)), 15);
        assert_eq!(whole_seconds(Duration::from_millis(400)), 0);
    }

    #[test]
    fn gauges_from_prometheus_text() {
        let text = "# HELP demo_in_flight requests\n\
                    # TYPE demo_in_flight gauge\n\
                    demo_in_flight 12\n\
                    demo_in_flight_total 99\n\
                    demo_in_flight{route=\"/a\"} 3.5\n\
                    other 4\n";
        assert_eq!(parse_gauge(text, "demo_in_flight"), Some(15));
        assert_eq!(parse_gauge(text, "other"), Some(4));
        assert_eq!(parse_gauge(text, "missing"), None);
        assert_eq!(parse_gauge("demo_in_flight NaN\n", "demo_in_flight"), None);
        assert_eq!(
            parse_gauge("demo_in_flight{broken 3\n", "demo_in_flight"),
            None
        );
    }
}
