//! The outage experiment against real server processes (`demo-client scenario`), and what
//! both the real and the simulated experiment write out.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_core::clock::{SystemWallClock, WallClock};
use tokio::task::JoinHandle;
use tower::BoxError;

use crate::drive::{PauseGuard, Progress, drive_phases, parse_gauge};
use crate::experiment::{RunSpec, Timing};
use crate::load::{LoadConfig, spawn_clients};
use crate::output::{RunRecord, outage_svg, write_csv};
use crate::process::{Pausable, ServerProcess, SpawnError};
use crate::record::{Event, Recorder};
use crate::report::{RunReport, Table};
use crate::stack::network_stack;

/// The gauge `demo-server` exposes on `/metrics` with the highest number of requests inside
/// its model since the previous scrape.
pub const SERVER_CONCURRENCY_METRIC: &str = "demo_server_concurrency_peak";

/// How often the server's concurrency is sampled during a real run: every 100 ms.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Which server a real run drives.
#[derive(Debug, Clone)]
pub enum Target {
    /// Start a `demo-server` child per run, with `--stack` set by the run and `args` after.
    Spawn {
        /// The `demo-server` executable.
        program: PathBuf,
        /// Extra arguments for every child.
        args: Vec<OsString>,
    },
    /// Drive a server that is already running at `url`, pausing the process `pid`.
    External {
        /// Where the clients send their requests.
        url: Uri,
        /// The process to SIGSTOP and SIGCONT.
        pid: Pausable,
    },
}

/// Everything one real run needs besides its spec.
#[derive(Debug, Clone)]
pub struct RealRun<'a> {
    /// The phases.
    pub timing: Timing,
    /// The clients.
    pub clients: std::num::NonZeroUsize,
    /// The mean think time.
    pub think_time: Duration,
    /// The per-attempt timeout.
    pub timeout: Duration,
    /// The cap on a response body, in bytes.
    pub max_body: usize,
    /// The seed of think times and jitter.
    pub seed: u64,
    /// The server.
    pub target: &'a Target,
    /// Where the server's output goes (a log file per run), if anywhere.
    pub log_dir: Option<&'a Path>,
}

/// Runs `spec` against a real server: start it (or take the external one), send load,
/// pause it with SIGSTOP, resume it with SIGCONT, observe, and stop everything.
///
/// The child server is killed and a paused process resumed on every exit path, including
/// when this future is dropped (which is how Ctrl-C ends a run).
pub async fn real_run(
    spec: RunSpec,
    run: &RealRun<'_>,
    progress: &mut Progress,
) -> Result<RunRecord, BoxError> {
    let (server, url, pausable) = match run.target {
        Target::Spawn { program, args } => {
            let mut all: Vec<OsString> = vec!["--stack".into(), spec.stack.name().into()];
            all.extend(args.iter().cloned());
            let log_path = run.log_dir.map(|dir| {
                dir.join(format!(
                    "server-{}-{}.log",
                    spec.strategy,
                    spec.stack.name()
                ))
            });
            let log = log_path.as_deref().map(File::create).transpose()?;
            let server = match ServerProcess::start(program, &all, log).await {
                Ok(server) => server,
                // A server that refuses its flags says why in its log: show it.
                Err(e @ SpawnError::Exited(_)) => {
                    let said = log_path
                        .and_then(|p| fs::read_to_string(p).ok())
                        .map(|text| text.trim().to_owned())
                        .filter(|text| !text.is_empty());
                    return Err(match said {
                        Some(said) => format!("{e}:\n{said}").into(),
                        None => e.into(),
                    });
                }
                Err(e) => return Err(e.into()),
            };
            let url: Uri = format!("http://{}/api", server.addr()).parse()?;
            let pausable = server.pausable();
            (Some(server), url, pausable)
        }
        Target::External { url, pid } => (None, url.clone(), *pid),
    };
    let metrics_url = metrics_url(&url)?;
    let load = LoadConfig::new(run.clients, run.think_time, url, run.seed)?;

    let recorder = Recorder::new();
    let stack = network_stack(
        spec.strategy,
        run.clients.get(),
        run.timeout,
        run.max_body,
        run.seed,
        &(Arc::new(SystemWallClock) as Arc<dyn WallClock>),
        &recorder,
    )?;
    let clients = spawn_clients(&stack, &load, &recorder);
    let sampler = spawn_sampler(vec![metrics_url], recorder.clone());

    let mut target = PauseGuard::new(pausable);
    let driven = drive_phases(&recorder, run.timing, &mut target, progress).await;
    progress.finish_run();
    let end = recorder.start() + run.timing.total();
    let unfinished = clients.stop(end).await;
    sampler.abort();
    drop(target);
    if let Some(server) = server {
        server.shutdown().await?;
    }
    driven?;
    let phases = run.timing.phases();
    Ok(RunRecord::new(
        spec.label(),
        recorder.seconds_until(phases.end()),
        unfinished,
        phases,
    ))
}

/// `/metrics` on the same authority as `url`.
pub(crate) fn metrics_url(url: &Uri) -> Result<Uri, http::Error> {
    let mut parts = url.clone().into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/metrics"));
    Ok(Uri::from_parts(parts)?)
}

/// Samples the servers' concurrency gauge every [`SAMPLE_EVERY`] through its own connection
/// pool (so samples are neither counted as load nor queued behind it), and records the sum
/// over `urls`. While a server is paused its sample times out and the others' sum is
/// recorded; while all are, nothing is.
pub(crate) fn spawn_sampler(urls: Vec<Uri>, recorder: Recorder) -> JoinHandle<()> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(SAMPLE_EVERY);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            interval.tick().await;
            let samples: Vec<_> = urls
                .iter()
                .map(|url| {
                    let client = client.clone();
                    let url = url.clone();
                    tokio::spawn(async move {
                        let sample = async {
                            let request = Request::get(url).body(Empty::new()).ok()?;
                            let response = client.request(request).await.ok()?;
                            let body = response.into_body().collect().await.ok()?.to_bytes();
                            parse_gauge(std::str::from_utf8(&body).ok()?, SERVER_CONCURRENCY_METRIC)
                        };
                        tokio::time::timeout(SAMPLE_EVERY * 3, sample)
                            .await
                            .ok()
                            .flatten()
                    })
                })
                .collect();
            let mut sum = None;
            for sample in samples {
                if let Ok(Some(c)) = sample.await {
                    *sum.get_or_insert(0) += c;
                }
            }
            if let Some(c) = sum {
                recorder.record(Event::ServerConcurrency(c));
            }
        }
    })
}

/// Writes `name.csv`, `name.svg` and `name.txt` (the table) into `dir`, creating it, and
/// returns their paths.
pub fn write_outputs(dir: &Path, name: &str, runs: &[RunRecord]) -> io::Result<[PathBuf; 3]> {
    fs::create_dir_all(dir)?;
    let csv = dir.join(format!("{name}.csv"));
    write_csv(BufWriter::new(File::create(&csv)?), runs)?;
    let svg = dir.join(format!("{name}.svg"));
    fs::write(&svg, outage_svg(runs))?;
    let txt = dir.join(format!("{name}.txt"));
    let reports: Vec<RunReport> = runs.iter().map(|r| r.report.clone()).collect();
    fs::write(&txt, Table(&reports).to_string())?;
    Ok([csv, svg, txt])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Second;
    use crate::report::Phases;

    #[test]
    fn metrics_url_keeps_the_authority() {
        let url = Uri::from_static("http://127.0.0.1:8070/api?x=1");
        assert_eq!(
            metrics_url(&url).unwrap(),
            Uri::from_static("http://127.0.0.1:8070/metrics")
        );
    }

    #[tokio::test]
    async fn a_server_that_refuses_its_flags_is_quoted() {
        // `sh -c` stands in for a demo-server that rejects a flag: it says why and exits.
        let dir = std::env::temp_dir().join(format!("demo-client-refused-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let script = dir.join("server");
        fs::write(
            &script,
            "#!/bin/sh\necho \"error: invalid value 'x' for '--backlog <N>'\" >&2\nexit 2\n",
        )
        .unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&script)
            .status()
            .unwrap();
        let target = Target::Spawn {
            program: script,
            args: Vec::new(),
        };
        let run = RealRun {
            timing: Timing::QUICK,
            clients: std::num::NonZeroUsize::new(1).unwrap(),
            think_time: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            max_body: 1024,
            seed: 1,
            target: &target,
            log_dir: Some(&dir),
        };
        let spec = "fixed:none".parse().unwrap();
        let err = real_run(spec, &run, &mut Progress::new(false))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("exited before accepting connections"), "{err}");
        assert!(
            err.contains("invalid value 'x' for '--backlog <N>'"),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outputs_are_written() {
        let dir = std::env::temp_dir().join(format!("demo-client-test-{}", std::process::id()));
        let phases = Phases {
            pause_at: 2,
            pause_for: 1,
            observe_for: 5,
        };
        let run = RunRecord::new("a", vec![Second::default(); 8], Vec::new(), phases);
        let paths = write_outputs(&dir, "scenario", &[run]).unwrap();
        for p in &paths {
            assert!(fs::metadata(p).unwrap().len() > 0, "{}", p.display());
        }
        assert!(fs::read_to_string(&paths[2]).unwrap().contains("never"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
