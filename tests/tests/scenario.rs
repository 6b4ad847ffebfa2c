//! The real outage experiment, short: `demo-server` child processes on 127.0.0.1, real
//! client sockets, SIGSTOP and SIGCONT, through the same code as `demo-client scenario
//! --quick`.
//!
//! The server binary is built by `cargo build --workspace --bin demo-server` from this test
//! (a test cannot depend on another package's binary): under `cargo test --workspace` that
//! build is already done; alone, the first run pays for it once.

use std::ffi::OsString;
use std::num::NonZeroUsize;
use std::time::Duration;

use demo_client::drive::Progress;
use demo_client::experiment::{RunSpec, ServerStack, Timing};
use demo_client::scenario::{RealRun, Target, real_run};
use demo_client::strategy::Strategy;

fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// The article's result with real processes: `demo-server` children with the article's
/// semantics (`--abandoned serve`, a 4096-connection listen queue), the article's load (1000
/// clients, 10 s mean think time, 2 s timeout per attempt), stopped with SIGSTOP for 8 s and
/// watched for 10 s after SIGCONT (`scenario --quick`).
///
/// - `fixed` against the bare server: the attempts queued during the pause push the model
///   past its collapse point (951 requests inside, where a request takes longer than the
///   clients' 2 s timeout), every timed-out attempt stays inside as abandoned work, and the
///   server never recovers;
/// - `full` against the full stack: the limiter keeps the model under its knee, the budget
///   and the stop signal keep the clients from piling on, and it recovers;
/// - `full` against the bare server (issue 21): the client stack alone, its throttle
///   refusing most requests of the pause locally, keeps the model under its knee, and the
///   server recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_articles_server_stays_down_under_fixed_retries_and_recovers_with_the_full_client_stack()
 {
    let program = integration_tests::workspace_binary("demo-server");
    let target = Target::Spawn {
        program,
        args: ["--abandoned", "serve", "--backlog", "4096"]
            .map(OsString::from)
            .to_vec(),
    };
    let timing = Timing::QUICK;
    let run = RealRun {
        timing,
        clients: NonZeroUsize::new(1000).unwrap(),
        think_time: Duration::from_secs(10),
        timeout: Duration::from_secs(2),
        max_body: 1 << 20,
        seed: 1,
        target: &target,
        log_dir: None,
    };
    let both = async {
        let fixed = real_run(
            RunSpec {
                strategy: Strategy::Fixed,
                stack: ServerStack::None,
            },
            &run,
            &mut Progress::new(false),
        )
        .await
        .expect("the fixed run succeeds");
        let full = real_run(
            RunSpec {
                strategy: Strategy::Full,
                stack: ServerStack::Full,
            },
            &run,
            &mut Progress::new(false),
        )
        .await
        .expect("the full run succeeds");
        let alone = real_run(
            RunSpec {
                strategy: Strategy::Full,
                stack: ServerStack::None,
            },
            &run,
            &mut Progress::new(false),
        )
        .await
        .expect("the client-alone run succeeds");
        (fixed, full, alone)
    };
    // NOTE: three runs of 21 s plus the servers' startup; the bound keeps a broken run from
    // hanging CI.
    let (fixed, full, alone) = tokio::time::timeout(Duration::from_secs(150), both)
        .await
        .expect("the runs end by themselves");
    let phases = timing.phases();

    for r in [&fixed.report, &full.report, &alone.report] {
        // 1000 clients thinking 10 s on average: about 100 requests per second.
        assert!(r.baseline > 60.0, "{}: baseline {}", r.label, r.baseline);
        assert!(
            r.peak_concurrency.is_some(),
            "{}: /metrics was sampled",
            r.label
        );
    }
    for record in [&fixed, &full, &alone] {
        // SIGSTOP froze the server: nothing succeeded during the pause after its first
        // second (responses already on their way may land in the first).
        let paused = &record.seconds[phases.pause_at + 1..phases.resume_at()];
        assert_eq!(
            paused.iter().map(|s| s.ok).sum::<u64>(),
            0,
            "{}: successes while stopped",
            record.report.label
        );
    }

    let f = &fixed.report;
    assert_eq!(f.recovery, None, "fixed recovered: {f:?}");
    let peak = f.peak_concurrency.unwrap_or(0);
    assert!(
        peak > 951,
        "fixed: peak concurrency {peak}, under the collapse point"
    );
    assert!(
        f.after_resume.timeouts > f.after_resume.ok,
        "fixed: {} timeouts, {} successes after resume",
        f.after_resume.timeouts,
        f.after_resume.ok
    );

    let g = &full.report;
    assert!(g.recovery.is_some(), "full did not recover: {g:?}");
    let peak = g.peak_concurrency.unwrap_or(u64::MAX);
    assert!(peak < 951, "full: peak concurrency {peak}");

    // The client alone: back within 2 s in a default run; a loaded machine's late timers
    // get one more second here.
    let a = &alone.report;
    let recovery = a
        .recovery
        .unwrap_or_else(|| panic!("full vs --stack none did not recover: {a:?}"));
    assert!(
        recovery <= 3,
        "full vs --stack none: recovered after {recovery} s"
    );
    let peak = a.peak_concurrency.unwrap_or(u64::MAX);
    assert!(peak < 951, "full vs --stack none: peak concurrency {peak}");
    assert!(
        a.throttled > 100,
        "full vs --stack none: {} refused",
        a.throttled
    );
}

#[tokio::test]
async fn the_child_server_is_gone_after_a_run() {
    let program = integration_tests::workspace_binary("demo-server");
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
