//! `demo-client bench`'s systems against a real `demo-server` child process: what the
//! runner sees when a system's process dies during a point.
//!
//! The server binary is built by `cargo build --workspace --bin demo-server` from this test
//! (a test cannot depend on another package's binary).

use demo_client::bench::system::{Model, Programs, Running, System};

/// Review S3: a server that exits during a point must not become a data point ("failed
/// 100 %"); the runner asks [`Running::exited`] before stopping the system, which names
/// the process and its exit status.
#[tokio::test]
async fn a_server_killed_during_a_point_is_reported_as_exited() {
    let programs = Programs {
        server: integration_tests::workspace_binary("demo-server"),
        envoy: None,
    };
    let dir = std::env::temp_dir().join(format!("bench-system-test-{}", std::process::id()));
    let mut running = Running::start(System::Bare, Model::Mmc, &programs, &dir)
        .await
        .expect("the bare server starts");
    assert_eq!(running.exited(), None, "running");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &running.server_pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let mut exited = None;
    for _ in 0..100 {
        exited = running.exited();
        if exited.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let exited = exited.expect("the kill is seen within 2 s");
    assert!(
        exited.starts_with("demo-server exited") && exited.contains("signal: 9"),
        "{exited}"
    );
    running.stop().await.ok();
    std::fs::remove_dir_all(&dir).ok();
}
