//! One real, short outage scenario: a `demo-server` child process on 127.0.0.1, real client
//! sockets, SIGSTOP and SIGCONT, through the same code as `demo-client scenario`.
//!
//! The server binary is built by `cargo build -p demo-server` from this test (a test cannot
//! depend on another package's binary), so the first run pays for that build once.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use demo_client::drive::Progress;
use demo_client::experiment::{RunSpec, ServerStack, Timing};
use demo_client::scenario::{RealRun, Target, real_run};
use demo_client::strategy::Strategy;

/// Builds the `demo-server` binary with the cargo running this test and returns its path.
fn demo_server_binary() -> PathBuf {
    let output = Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "-p",
            "demo-server",
            "--bin",
            "demo-server",
            "--message-format=json",
        ])
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building demo-server failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The last artifact message names the executable; read it without a JSON parser.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout
        .lines()
        .filter_map(|line| line.split_once("\"executable\":\"")?.1.split_once('"'))
        .map(|(path, _)| PathBuf::from(path))
        .next_back()
        .expect("cargo reports the demo-server executable");
    assert!(path.is_file(), "{}", path.display());
    path
}

fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_pause_and_resume_with_the_full_stack() {
    let program = demo_server_binary();
    let target = Target::Spawn {
        program,
        args: Vec::new(),
    };
    let timing = Timing::new(
        Duration::from_secs(6),
        Duration::from_secs(3),
        Duration::from_secs(10),
    )
    .unwrap();
    let run = RealRun {
        timing,
        // 100 clients thinking 1 s on average: about 100 requests per second.
        clients: NonZeroUsize::new(100).unwrap(),
        think_time: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        seed: 7,
        target: &target,
        log_dir: None,
    };
    let spec = RunSpec {
        strategy: Strategy::Full,
        stack: ServerStack::Full,
    };
    let record = tokio::time::timeout(
        Duration::from_secs(60),
        real_run(spec, &run, &mut Progress::new(false)),
    )
    .await
    .expect("the run ends by itself")
    .expect("the run succeeds");

    let phases = timing.phases();
    let report = &record.report;
    assert!(report.baseline > 50.0, "baseline {}", report.baseline);
    // SIGSTOP froze the server: nothing succeeded during the pause after its first second
    // (responses already on their way may land in the first), and attempts timed out.
    let paused = &record.seconds[phases.pause_at + 1..phases.resume_at()];
    assert_eq!(
        paused.iter().map(|s| s.ok).sum::<u64>(),
        0,
        "successes while stopped"
    );
    let timed_out: u64 = record.seconds[phases.pause_at..=phases.resume_at()]
        .iter()
        .map(|s| s.timeouts)
        .sum();
    assert!(timed_out > 0, "no timeout while the server was stopped");
    // SIGCONT: the server answers again. The last 5 seconds average at least 80% of the
    // baseline. (The 90% recovery rule is left to the simulation: on a shared machine, in
    // real time, with 100 requests per second, noise alone can decide it.)
    let tail = &record.seconds[phases.end() - 5..phases.end()];
    let ok_per_second = tail.iter().map(|s| s.ok).sum::<u64>() as f64 / 5.0;
    assert!(
        ok_per_second >= 0.8 * report.baseline,
        "{ok_per_second} OK/s after resume, baseline {}",
        report.baseline
    );
    assert!(report.peak_concurrency.is_some(), "/metrics was sampled");
}

#[tokio::test]
async fn the_child_server_is_gone_after_a_run() {
    let program = demo_server_binary();
    let server = demo_client::process::ServerProcess::start(&program, &[], None)
        .await
        .expect("demo-server starts");
    let pid = server.pausable().pid();
    server.pausable().pause().unwrap();
    assert!(is_running(pid));
    // Dropped while paused, as on Ctrl-C in the middle of a pause.
    drop(server);
    let mut gone = false;
    for _ in 0..500 {
        if !is_running(pid) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone, "demo-server {pid} survived its handle");
}
