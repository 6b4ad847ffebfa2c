//! The outage experiment in virtual time, in process (`demo-client simulate`).
//!
//! The server is `demo-server`'s application (its latency model, and the middleware of
//! `--stack full`) reached through [`Loopback`], an in-process hop with one task per request.
//! The pause stops the whole server like SIGSTOP: a [`Gate`] in front of the middleware holds
//! new requests in a bounded listen queue (drained on resume; arrivals to a full queue are
//! never seen, as the kernel drops their SYNs), and the model's pause switch freezes the
//! requests inside. [`Abandoned`] chooses what the server does with a request whose client
//! gave up: serve it to the end (the article's server, and `demo-server`'s default) or drop
//! it once the server runs (hyper's own behaviour, `demo-server --abandoned cancel`). The
//! clients are the same load generator and client stack as `scenario`.
//!
//! Where it differs from the real run: time is virtual, so nothing competes for the CPU
//! (on a busy machine the real server wakes requests late and a real client's timers fire
//! late); connections are not modelled (no connection setup, no descriptor limits, no
//! keep-alive); and the listen queue counts requests, where the kernel's counts connections
//! (a queued connection may carry several pipelined requests; the demo's clients send one).
//!
//! Each run gets a fresh single-threaded runtime with tokio's clock paused: time only moves
//! when every task waits, so a 95-second run takes as long as its work. With the same seed
//! every figure and every per-second count is the same: the listen queue hands requests over
//! in the order they queued (as the kernel's does), and the clients and the server read one
//! time of day, from a fixed start, that paused time moves.

use std::sync::Arc;
use std::time::Duration;

use demo_server::model::{LatencyModel, Model, PauseSwitch};
use overload_core::clock::{TokioWallClock, WallClock};
use tower::BoxError;

use crate::client::{Abandoned, Gate, Loopback};
use crate::drive::{Pause, PauseGuard, Progress, drive_phases};
use crate::experiment::{RunSpec, Timing};
use crate::load::{LoadConfig, spawn_clients};
use crate::output::RunRecord;
use crate::record::{Event, Recorder};
use crate::stack::client_stack;
use crate::strategy::Strategy;

/// How often the model's concurrency peak is sampled in a simulated run: every 100 ms.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Everything a simulated run needs besides its spec.
#[derive(Debug, Clone)]
pub struct SimulatedRun {
    /// The phases.
    pub timing: Timing,
    /// The clients (the URL is only used for the requests' target).
    pub load: LoadConfig,
    /// The per-attempt timeout.
    pub timeout: Duration,
    /// The cap on a response body, in bytes.
    pub max_body: usize,
    /// What the server does with requests whose clients gave up: [`Abandoned::Serve`] is
    /// the article's server (and `demo-server`'s default); [`Abandoned::Cancel`] is hyper's
    /// own behaviour (`demo-server --abandoned cancel`).
    pub abandoned: Abandoned,
    /// The listen queue: requests held while the server is stopped (`demo-server
    /// --backlog`).
    pub backlog: usize,
}

/// The whole simulated process as a [`Pause`] target: the gate in front of the middleware
/// (new requests wait in the listen queue) and the model's switch (requests inside freeze).
#[derive(Debug, Clone)]
struct Process {
    gate: Gate,
    model: PauseSwitch,
}

impl Pause for Process {
    fn pause(&self) -> std::io::Result<()> {
        self.gate.pause();
        self.model.pause();
        Ok(())
    }

    fn resume(&self) -> std::io::Result<()> {
        self.model.resume();
        self.gate.resume();
        Ok(())
    }
}

/// Runs `spec` in virtual time and returns its series and figures.
///
/// # Errors
///
/// When the runtime cannot be built or the pause switch fails, or for `full-reqwest` and
/// `reqwest-default`, which need a real network.
pub fn simulate_run(
    spec: RunSpec,
    run: &SimulatedRun,
    progress: &mut Progress,
) -> Result<RunRecord, BoxError> {
    if matches!(
        spec.strategy,
        Strategy::FullReqwest | Strategy::ReqwestDefault
    ) {
        return Err(format!(
            "{} runs over the network only: use `scenario`, not `simulate`",
            spec.strategy
        )
        .into());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let record = runtime.block_on(async {
        let switch = PauseSwitch::new(run.backlog);
        let gate = Gate::new(run.backlog);
        let model = Model::with_pause_switch(LatencyModel::default(), switch.clone());
        let server = crate::server::router(spec.stack, model.clone())?;

        let recorder = Recorder::new();
        let stack = client_stack(
            Loopback::new(server, gate.clone(), run.abandoned),
            spec.strategy,
            run.timeout,
            run.max_body,
            run.load.seed(),
            // NOTE: the clients and the server read one time of day, which paused time moves
            // (see `server::router`).
            &(Arc::new(TokioWallClock::new()) as Arc<dyn WallClock>),
            &recorder,
        );
        let clients = spawn_clients(&stack, &run.load, &recorder);
        let sampler = {
            let recorder = recorder.clone();
            let model = model.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(SAMPLE_EVERY);
                loop {
                    interval.tick().await;
                    let peak = u64::try_from(model.take_peak_concurrency()).unwrap_or(u64::MAX);
                    recorder.record(Event::ServerConcurrency(peak));
                }
            })
        };
        let mut target = PauseGuard::new(Process {
            gate,
            model: switch,
        });
        let driven = drive_phases(&recorder, run.timing, &mut target, progress).await;
        let end = recorder.start() + run.timing.total();
        let unfinished = clients.stop(end).await;
        sampler.abort();
        driven?;
        let phases = run.timing.phases();
        Ok::<_, BoxError>(RunRecord::new(
            spec.label(),
            recorder.seconds_until(phases.end()),
            unfinished,
            phases,
        ))
    })?;
    // NOTE: dropping the runtime cancels what is left of the server's work (requests still
    // inside the model), which no figure reads.
    drop(runtime);
    Ok(record)
}
