//! The pools gateway: `POST /v1/chat/completions` routed through [`PoolsLayer`] to the
//! provider its partition names (a fallback may change it), `GET /pools` (every partition's
//! statistics as JSON) and `GET /metrics` (a Prometheus text page per partition).
#![allow(dead_code)]

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use llm_bulkhead::pools::Pools;
use llm_bulkhead::tower::{HeaderPoolClassifier, PoolAssignment, PoolsLayer};
use std::collections::HashMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

/// The providers × classes matrix of the demo.
pub const CONFIG: &str = r#"
max_attempts = 2
[global]
max_active = 16
[providers.primary]
connection_limit = 3
[providers.secondary]
connection_limit = 4
[classes.interactive]
overflow = "fallback"
[classes.batch]
overflow = "wait"
[partitions.primary-interactive]
provider = "primary"
traffic_class = "interactive"
active_limit = 2
fallback = ["secondary-interactive"]
[partitions.secondary-interactive]
provider = "secondary"
traffic_class = "interactive"
active_limit = 2
[partitions.primary-batch]
provider = "primary"
traffic_class = "batch"
active_limit = 1
pending_limit = 2
queue_max_age_ms = 30000
[partitions.secondary-batch]
provider = "secondary"
traffic_class = "batch"
active_limit = 2
pending_limit = 2
queue_max_age_ms = 30000
"#;

/// The gateway's state: the pools and each provider's address.
pub struct Gateway {
    pub pools: Arc<Pools>,
    pub upstreams: HashMap<String, SocketAddr>,
}

/// The gateway's router over `pools`, calling `upstreams` by provider name.
pub fn router(pools: Arc<Pools>, upstreams: HashMap<String, SocketAddr>) -> Router {
    let gw = Arc::new(Gateway {
        pools: pools.clone(),
        upstreams,
    });
    let classify = HeaderPoolClassifier::new().default_class("interactive");
    let routed = Router::new()
        .route("/v1/chat/completions", post(forward))
        .layer(PoolsLayer::new(pools, classify))
        .with_state(gw.clone());
    Router::new()
        .route("/pools", get(stats))
        .route("/metrics", get(metrics))
        .with_state(gw)
        .merge(routed)
}

/// Sends the request to the provider the pools chose; the response body streams back, and the
/// permit is held until its last byte.
async fn forward(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let Some(to) = req.extensions().get::<PoolAssignment>().cloned() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no pool assignment").into_response();
    };
    let Some(addr) = gw.upstreams.get(&to.provider).copied() else {
        return (StatusCode::BAD_GATEWAY, "unknown provider").into_response();
    };
    match call(addr, req).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

/// One request on its own connection to `addr`.
async fn call(
    addr: SocketAddr,
    req: Request,
) -> Result<hyper::Response<hyper::body::Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (parts, body) = req.into_parts();
    let mut out = hyper::Request::post(parts.uri.path())
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(len) = parts.headers.get(header::CONTENT_LENGTH) {
        out = out.header(header::CONTENT_LENGTH, len);
    }
    Ok(sender.send_request(out.body(body)?).await?)
}

async fn stats(State(gw): State<Arc<Gateway>>) -> Json<llm_bulkhead::pools::PoolsStats> {
    Json(gw.pools.stats())
}

/// A Prometheus text page of the partitions' counts.
async fn metrics(State(gw): State<Arc<Gateway>>) -> String {
    let s = gw.pools.stats();
    let mut out = String::new();
    for p in &s.partitions {
        let l = format!("partition=\"{}\",provider=\"{}\"", p.name, p.provider);
        let oldest = p.oldest_wait.map_or(0, |d| d.as_millis());
        for (name, v) in [
            ("active", p.active as u128),
            ("active_limit", p.active_limit as u128),
            ("pending", p.pending as u128),
            ("pending_limit", p.pending_limit as u128),
            ("oldest_wait_ms", oldest),
            ("admitted_total", p.admitted as u128),
            ("refused_active_total", p.refused_active as u128),
            ("refused_connection_total", p.refused_connection as u128),
            ("queue_refusals_total", p.queue_refusals as u128),
            ("timed_out_total", p.timed_out as u128),
            ("fallbacks_total", p.fallbacks as u128),
        ] {
            let _ = writeln!(out, "llm_bulkhead_pool_{name}{{{l}}} {v}");
        }
    }
    out
}
