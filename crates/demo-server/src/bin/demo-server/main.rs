//! `demo-server`: a backend that behaves like an overloaded server, so the overload layers
//! can be watched at work. See `demo-server --help`.
//!
//! The flags and their checks are in `cli`, the status line in `status`; this file starts
//! the runtime, serves, and stops on a signal.

mod cli;
mod status;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use demo_server::app::{AppConfig, Stack, app};
use demo_server::model::Model;
use demo_server::server::{
    Abandoned, Server, ServerConfig, connections_within, listen, raise_open_files_limit,
};
use metrics_exporter_prometheus::PrometheusBuilder;

use cli::{Cli, Plan};
use status::{describe, status_lines};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let plan = match cli.plan() {
        Ok(plan) => plan,
        Err(message) => Cli::command()
            .error(ErrorKind::ValueValidation, message)
            .exit(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // NOTE: a reload of the limits file at INFO too: what changed, once.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,ratelimit_layer::limits_file=info")
                }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(plan)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(plan: Plan) -> Result<(), String> {
    let server_config = fit_to_open_files(plan.server);
    let listener = listen(plan.listen, plan.backlog).map_err(|e| bind_error(plan.listen, &e))?;
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;

    if let Some(store) = &plan.redis {
        // NOTE: connected before serving, so that the first requests do not spend their
        // budget on the handshake; a Redis that is away is not fatal (the local share
        // decides until it answers).
        match tokio::time::timeout(Duration::from_secs(2), store.ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // NOTE: the error says that Redis does not answer; its source says why.
                let why =
                    std::error::Error::source(&e).map_or_else(String::new, |s| format!(": {s}"));
                eprintln!("warning: {e}{why}; limiting locally until it answers");
            }
            Err(_) => eprintln!(
                "warning: Redis at {} does not answer within 2 s; limiting locally until it does",
                store.addr()
            ),
        }
    }
    let model = Model::new(plan.latency);
    let histogram = plan.stack.overload().map(|o| o.histogram().clone());
    let adaptive = match &plan.stack {
        Stack::Adaptive { adaptive, .. } => Some(adaptive.clone()),
        Stack::None | Stack::Deadline | Stack::Full { .. } | Stack::Peer(_) => None,
    };
    let stack_name = plan.stack.name();
    let mut config = AppConfig::new(model.clone())
        .admin(plan.admin)
        .stack(plan.stack)
        .deadline(plan.deadline)
        .metrics(metrics.clone());
    if let Some(downstream) = plan.downstream {
        config = config.downstream(downstream);
    }
    let stats = config.stats().clone();
    let server = Server::new(listener, app(config), server_config);
    let addr = server.local_addr().map_err(|e| e.to_string())?;

    println!(
        "demo-server listening on http://{addr} (GET /api, /healthz, /metrics); model: {}; stack: {}; abandoned requests: {}{}",
        describe(model.latency()),
        stack_name,
        match server_config.abandoned() {
            Abandoned::Serve => "served to the end",
            Abandoned::Cancel => "cancelled",
        },
        plan.redis
            .as_ref()
            .map(|store| format!(
                "; rate limit in Redis{} at {}",
                if store.is_cluster() { " Cluster" } else { "" },
                store.addr()
            ))
            .unwrap_or_default(),
    );
    let status = tokio::spawn(status_lines(
        model,
        stats,
        server.stats(),
        histogram,
        adaptive,
        metrics,
        plan.quiet,
    ));
    let result = server.run(shutdown_signal()).await;
    status.abort();
    result.map_err(|e| format!("the server failed: {e}"))
}

/// Raises the open-files limit as Go's runtime does, and lowers the connection cap, with a
/// warning, when the limit cannot hold it (see `connections_within`).
fn fit_to_open_files(config: ServerConfig) -> ServerConfig {
    let limit = match raise_open_files_limit() {
        Ok(limit) => limit,
        Err(e) => {
            eprintln!("warning: cannot raise the open-files limit: {e}");
            Some(rustix::process::getrlimit(
                rustix::process::Resource::Nofile,
            ))
            .and_then(|l| l.current)
        }
    };
    let Some(limit) = limit else {
        return config;
    };
    let fits = connections_within(limit);
    if config.max_connections().get() <= fits {
        return config;
    }
    eprintln!(
        "warning: --max-connections {} lowered to {fits}: the process may open {limit} files",
        config.max_connections()
    );
    let fits = NonZeroUsize::new(fits).unwrap_or(NonZeroUsize::MIN);
    ServerConfig::builder()
        .abandoned(config.abandoned())
        .header_read_timeout(config.header_read_timeout())
        .max_connections(fits)
        .build()
        .unwrap_or(config)
}

fn bind_error(addr: SocketAddr, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "cannot listen on {addr}: the address is already in use (another demo-server?); \
             stop it or choose another address with --listen"
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "cannot listen on {addr}: the address is not one of this machine's; \
             try --listen 127.0.0.1:8070"
        ),
        std::io::ErrorKind::PermissionDenied => {
            format!("cannot listen on {addr}: permission denied (ports below 1024 need privileges)")
        }
        _ => format!("cannot listen on {addr}: {e}"),
    }
}

/// Resolves on the first SIGINT or SIGTERM; a second one exits at once.
async fn shutdown_signal() {
    wait_for_signal().await;
    eprintln!("shutting down: waiting for in-flight requests (Ctrl-C again to stop now)");
    tokio::spawn(async {
        wait_for_signal().await;
        eprintln!("stopping now");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_port_error_says_what_to_do() {
        let e = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let msg = bind_error("127.0.0.1:8070".parse().unwrap(), &e);
        assert!(
            msg.contains("already in use") && msg.contains("--listen"),
            "{msg}"
        );
    }
}
