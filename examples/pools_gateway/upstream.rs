//! A fake provider on loopback for the pools gateway: `POST /v1/chat/completions` answers
//! `{"provider": NAME, ...}`. A gate holds every request until it opens (how a test, or the
//! demo's `slow` switch, makes the provider slow without any timing); each arrival is
//! announced on a channel.
#![allow(dead_code)]

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// A provider's gate and counters.
pub struct Upstream {
    pub name: String,
    gate: watch::Sender<bool>,
    arrivals: mpsc::UnboundedSender<()>,
    /// Requests answered.
    pub served: AtomicU64,
}

impl Upstream {
    /// A provider whose gate starts `open`, and the receiver of its arrivals.
    pub fn new(name: &str, open: bool) -> (Arc<Upstream>, mpsc::UnboundedReceiver<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let up = Upstream {
            name: name.to_owned(),
            gate: watch::channel(open).0,
            arrivals: tx,
            served: AtomicU64::new(0),
        };
        (Arc::new(up), rx)
    }

    /// Opens or closes the gate: closed, every request waits at the provider.
    pub fn set_open(&self, open: bool) {
        self.gate.send_replace(open);
    }
}

async fn chat(State(up): State<Arc<Upstream>>, Json(request): Json<Value>) -> Json<Value> {
    let _ = up.arrivals.send(());
    let mut gate = up.gate.subscribe();
    // Wait until the gate is open (at once if it is).
    let _ = gate.wait_for(|open| *open).await;
    up.served.fetch_add(1, Ordering::SeqCst);
    Json(json!({
        "provider": up.name,
        "model": request.get("model").cloned().unwrap_or(Value::Null),
        "choices": [{"message": {"role": "assistant", "content": "hello"}}],
    }))
}

/// The provider's routes.
pub fn router(up: Arc<Upstream>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(up)
}
