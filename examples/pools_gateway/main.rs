//! Two fake providers behind gateway pools, on loopback.
//!
//! ```text
//! cargo run --example pools_gateway --features tower,toml
//! ```
//!
//! It prints the gateway's address and curl lines: a request to each provider, the primary
//! made slow (its gate closed: requests wait there), its interactive partition overflowing to
//! the secondary (the `x-pool-route` header lists every decision), its batch partition
//! queueing and then refusing (`pending_limit_reached`), and the per-partition `/metrics`.
//! `POST /slow` and `POST /fast` close and open the primary's gate.

mod app;
mod upstream;

use axum::routing::post;
use axum::Router;
use llm_bulkhead::pools::{Pools, PoolsConfig};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::net::TcpListener;

async fn serve(router: Router) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = PoolsConfig::from_toml(app::CONFIG)?;
    let pools = Arc::new(Pools::new(&config)?);
    let (primary, _) = upstream::Upstream::new("primary", true);
    let (secondary, _) = upstream::Upstream::new("secondary", true);
    let mut upstreams = HashMap::new();
    upstreams.insert(
        "primary".into(),
        serve(upstream::router(primary.clone())).await,
    );
    upstreams.insert("secondary".into(), serve(upstream::router(secondary)).await);
    let (slow, fast) = (primary.clone(), primary);
    let switches = Router::new()
        .route("/slow", post(move || async move { slow.set_open(false) }))
        .route("/fast", post(move || async move { fast.set_open(true) }));
    let gw = serve(app::router(pools, upstreams).merge(switches)).await;
    let chat = format!(
        "curl -si http://{gw}/v1/chat/completions -H 'content-type: application/json' \
         -d '{{\"model\":\"m\",\"messages\":[]}}'"
    );
    println!("pools gateway on http://{gw}");
    println!("  {chat} -H 'x-provider: primary'");
    println!("  {chat} -H 'x-provider: secondary'");
    println!("  curl -X POST http://{gw}/slow   # the primary holds every request");
    println!("  ({chat} -H 'x-provider: primary' &) ; ({chat} -H 'x-provider: primary' &)");
    println!("  {chat} -H 'x-provider: primary'   # x-pool-route: ...:fallback:...,secondary-interactive:dispatch:...");
    println!("  {chat} -H 'x-provider: primary' -H 'x-traffic-class: batch'   # waits (or 429 pending_limit_reached)");
    println!("  curl -s http://{gw}/metrics");
    println!("  curl -X POST http://{gw}/fast   # the waiters start");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
