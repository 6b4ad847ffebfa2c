//! An axum server behind the rate limiter, configured from flags.
//!
//! ```text
//! cargo run -p ratelimit-layer --example server -- \
//!     --rate-limit 100 --burst 20 --algorithm token-bucket --key ip --port 3000
//! ```
//!
//! Then `curl -i http://127.0.0.1:3000/` a few times quickly: past the burst the answers are
//! `429` with `Retry-After`, `RateLimit-Policy` and `RateLimit`. Stops on Ctrl-C.

use axum::Router;
use axum::routing::get;
use ratelimit_layer::axum_0_8::into_make_service_with_peer_addr;
use ratelimit_layer::config::RateLimitConfig;

fn usage() -> ! {
    eprintln!(
        "usage: server [--rate-limit <per second>] [--burst <n>] \
         [--algorithm token-bucket|fixed-window|sliding-window] [--key global|ip] [--port <n>]"
    );
    std::process::exit(2)
}

fn parse<T: std::str::FromStr>(flag: &str, value: Option<String>) -> T
where
    T::Err: std::fmt::Display,
{
    let value = value.unwrap_or_else(|| usage());
    value.parse().unwrap_or_else(|e| {
        eprintln!("{flag}: {e}");
        usage()
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = RateLimitConfig {
        rate: 100,
        // `--key ip` reads the peer address that `into_make_service_with_peer_addr` puts in
        // every request (the default `ClientIp`).
        admitted_headers: true,
        ..RateLimitConfig::default()
    };
    let mut port: u16 = 3000;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--rate-limit" => config.rate = parse(&flag, args.next()),
            "--burst" => config.burst = Some(parse(&flag, args.next())),
            "--algorithm" => config.algorithm = parse(&flag, args.next()),
            "--key" => config.key = parse(&flag, args.next()),
            "--port" => port = parse(&flag, args.next()),
            _ => usage(),
        }
    }
    let layer = config.layer()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}: {} per second, burst {:?}, {} keyed by {}",
        listener.local_addr()?,
        config.rate,
        config.burst,
        config.algorithm,
        config.key
    );
    axum::serve(listener, into_make_service_with_peer_addr(app))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
