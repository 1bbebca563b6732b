//! A real HTTP gateway: axum on loopback in front of a fake OpenAI-compatible provider (also on
//! loopback), admission by the bulkhead's tower layer, held to the last streamed byte.
//!
//! ```text
//! cargo run --release --example gateway --features tower,metrics,tracing -- [--listen 127.0.0.1:8080]
//!     [--config bulkhead.json|bulkhead.toml] [--seed 7] [--no-latency]
//!     [--header-timeout-ms 10000] [--body-timeout-ms 30000] [--idle-timeout-ms 60000]
//!     [--drain-timeout-ms 20000]
//! ```
//!
//! The server (`serve.rs`) closes connections whose request head does not arrive within the
//! header timeout (idle keep-alives included), bodies not complete within the body timeout
//! (408), and connections that move no byte for the idle timeout. SIGTERM and SIGINT both
//! close the bulkhead, let responses in flight finish, and cut what is left at the drain
//! deadline: a shutdown takes at most that long, whatever clients do.
//!
//! Endpoints: `POST /v1/chat/completions` (JSON, or SSE with `"stream": true`; the class from
//! `x-traffic-class`, the priority from `x-priority`), `GET /metrics` (Prometheus text),
//! `GET /stats`, `GET|POST /admin/limits` (a limits snapshot, classes by name; the kill switch
//! is `max_concurrent: 0`), `POST /admin/provider/slow` (`{"slow": true}` makes the provider
//! ten times slower). The README's "HTTP gateway" section has `curl` lines.

mod app;
mod provider;
mod serve;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use llm_bulkhead::config::BulkheadConfig;
use provider::ProviderControl;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

struct Args {
    listen: SocketAddr,
    config: Option<std::path::PathBuf>,
    seed: u64,
    realtime: bool,
    timeouts: serve::Timeouts,
    body_read: Duration,
}

fn millis(name: &str, value: Result<String, String>) -> Result<Duration, String> {
    let ms: u64 = value?.parse().map_err(|e| format!("{name}: {e}"))?;
    if ms == 0 {
        return Err(format!("{name}: must be at least 1"));
    }
    Ok(Duration::from_millis(ms))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:8080".parse().map_err(|e| format!("{e}"))?,
        config: None,
        seed: 7,
        realtime: true,
        timeouts: serve::Timeouts::default(),
        body_read: app::BODY_READ_TIMEOUT,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--listen" => {
                args.listen = value("--listen")?
                    .parse()
                    .map_err(|e| format!("--listen: {e}"))?
            }
            "--config" => args.config = Some(value("--config")?.into()),
            "--seed" => {
                args.seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?
            }
            "--no-latency" => args.realtime = false,
            "--header-timeout-ms" => {
                args.timeouts.header_read = millis(&a, value("--header-timeout-ms"))?
            }
            "--body-timeout-ms" => args.body_read = millis(&a, value("--body-timeout-ms"))?,
            "--idle-timeout-ms" => args.timeouts.idle = millis(&a, value("--idle-timeout-ms"))?,
            "--drain-timeout-ms" => {
                args.timeouts.drain = millis(&a, value("--drain-timeout-ms"))?
            }
            "-h" | "--help" => {
                return Err("usage: gateway [--listen 127.0.0.1:PORT] [--config FILE] [--seed N] [--no-latency] [--header-timeout-ms MS] [--body-timeout-ms MS] [--idle-timeout-ms MS] [--drain-timeout-ms MS]".into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if !args.listen.ip().is_loopback() {
        return Err(format!(
            "--listen {}: this example serves on loopback only",
            args.listen
        ));
    }
    Ok(args)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Slow {
    slow: bool,
}

async fn set_slow(
    State(control): State<Arc<ProviderControl>>,
    Json(s): Json<Slow>,
) -> Json<serde_json::Value> {
    control.slow.store(s.slow, Ordering::Relaxed);
    Json(serde_json::json!({ "slow": s.slow }))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_target(true)
        .init();
    let config = match &args.config {
        Some(path) => BulkheadConfig::from_file(path),
        None => BulkheadConfig::from_json(app::DEFAULT_CONFIG),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("configuration: {e}");
            std::process::exit(2);
        }
    };
    let control = ProviderControl::new(args.seed, args.realtime);
    let provider = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the provider on loopback");
    let upstream = provider.local_addr().expect("the provider's address");
    let provider_router = provider::router(control.clone());
    tokio::spawn(async move { axum::serve(provider, provider_router).await });
    let (router, gw) = match app::gateway_with(&config, upstream, "gateway", args.body_read) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("configuration: {e}");
            std::process::exit(2);
        }
    };
    let router = router.merge(
        Router::new()
            .route("/admin/provider/slow", post(set_slow))
            .with_state(control),
    );
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bind {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let addr = listener.local_addr().expect("the gateway's address");
    println!(
        "gateway on http://{addr} (provider on http://{upstream}), classes {:?}",
        gw.bulkhead.class_names()
    );
    println!("try: curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' -d '{{\"model\":\"gpt-4o\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"max_tokens\":64}}'");
    // Installed now, so that a signal sent from here on is never lost.
    let signals = match serve::signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("signal handlers: {e}");
            std::process::exit(1);
        }
    };
    let shutdown = async {
        let name = signals.await;
        println!(
            "{name}: closing the bulkhead and draining (at most {:?})",
            args.timeouts.drain
        );
    };
    let stopped = serve::serve(
        listener,
        router,
        gw.bulkhead.clone(),
        args.timeouts,
        shutdown,
    )
    .await;
    println!(
        "closed: drained = {}, connections cut = {}, in flight = {}",
        stopped.drained, stopped.cut, stopped.in_flight
    );
}
