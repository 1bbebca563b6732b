//! A fake OpenAI-compatible provider on loopback: `POST /v1/chat/completions`, JSON or SSE
//! (`"stream": true`, ending with a usage chunk and `[DONE]`). Latency and usage come from a
//! seeded generator; a switch makes it slow, and a hold lets tests pause every response before
//! its last part.
#![allow(dead_code)]

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use http_body::Frame;
use serde_json::{json, Value};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};

/// The provider's switches and counters, shared with the gateway's admin endpoint and tests.
pub struct ProviderControl {
    seed: u64,
    requests: AtomicU64,
    /// Sleep the drawn latencies (the example); tests run with `false` and never sleep.
    realtime: bool,
    /// Ten times the latency.
    pub slow: AtomicBool,
    hold: watch::Sender<bool>,
    paused: AtomicUsize,
    paused_changed: Notify,
    /// Streams whose client went away before the end.
    pub cancelled: AtomicU64,
    /// Requests the provider answered (or started answering).
    pub served: AtomicU64,
}

impl ProviderControl {
    pub fn new(seed: u64, realtime: bool) -> Arc<ProviderControl> {
        Arc::new(ProviderControl {
            seed,
            requests: AtomicU64::new(0),
            realtime,
            slow: AtomicBool::new(false),
            hold: watch::channel(false).0,
            paused: AtomicUsize::new(0),
            paused_changed: Notify::new(),
            cancelled: AtomicU64::new(0),
            served: AtomicU64::new(0),
        })
    }

    /// While on, every response pauses before its last part (the final chunk, or the whole JSON
    /// body) until it is turned off.
    pub fn set_hold(&self, on: bool) {
        self.hold.send_replace(on);
    }

    /// Waits until at least `n` responses are paused by the hold.
    pub async fn paused_at_least(&self, n: usize) {
        loop {
            let changed = self.paused_changed.notified();
            if self.paused.load(Ordering::SeqCst) >= n {
                return;
            }
            changed.await;
        }
    }

    async fn checkpoint(&self) {
        let mut rx = self.hold.subscribe();
        if !*rx.borrow_and_update() {
            return;
        }
        self.paused.fetch_add(1, Ordering::SeqCst);
        self.paused_changed.notify_waiters();
        let _ = rx.wait_for(|on| !*on).await;
        self.paused.fetch_sub(1, Ordering::SeqCst);
    }

    async fn latency(&self, ms: u64) {
        if self.realtime {
            let ms = if self.slow.load(Ordering::Relaxed) {
                ms * 10
            } else {
                ms
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// splitmix64: a small seeded generator (deterministic per request number).
fn draw(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What one request gets: its latency, its usage and how many chunks a stream has.
struct Plan {
    id: u64,
    latency_ms: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    chunks: u64,
}

fn plan(control: &ProviderControl, request: &Value) -> Plan {
    let id = control.requests.fetch_add(1, Ordering::Relaxed);
    let mut s = control.seed ^ id.wrapping_mul(0x2545_f491_4f6c_dd1d);
    let chars: usize = request["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| m["content"].as_str().map_or(0, str::len))
                .sum()
        })
        .unwrap_or(0);
    let cap = request["max_tokens"].as_u64().unwrap_or(256).clamp(1, 4096);
    let completion_tokens = 1 + draw(&mut s) % cap;
    Plan {
        id,
        latency_ms: 20 + draw(&mut s) % 180,
        prompt_tokens: (chars as u64).div_ceil(4) + 3,
        completion_tokens,
        chunks: 1 + (completion_tokens / 8).min(15),
    }
}

/// The provider's router.
pub fn router(control: Arc<ProviderControl>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(control)
}

async fn completions(State(control): State<Arc<ProviderControl>>, body: Bytes) -> Response {
    let request: Value =
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": {"type": "invalid_request_error", "message": e.to_string()}})),
            )
                .into_response(),
        };
    control.served.fetch_add(1, Ordering::Relaxed);
    let plan = plan(&control, &request);
    let model = request["model"].as_str().unwrap_or("fake-model").to_owned();
    let usage = json!({
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
    });
    if request["stream"].as_bool() != Some(true) {
        control.latency(plan.latency_ms).await;
        control.checkpoint().await;
        let text = "tok ".repeat(plan.completion_tokens as usize);
        return Json(json!({
            "id": format!("chatcmpl-{}", plan.id),
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        }))
        .into_response();
    }
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let per_chunk = plan.latency_ms / plan.chunks;
        let id = format!("chatcmpl-{}", plan.id);
        let tokens_per_chunk = plan.completion_tokens.div_ceil(plan.chunks);
        for _ in 0..plan.chunks {
            control.latency(per_chunk).await;
            let chunk = json!({
                "id": id, "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"content": "tok ".repeat(tokens_per_chunk as usize)}}],
            });
            if tx.send(sse(&chunk)).await.is_err() {
                control.cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        control.checkpoint().await;
        let last = json!({"id": id, "object": "chat.completion.chunk", "model": model, "choices": [], "usage": usage});
        if tx.send(sse(&last)).await.is_err()
            || tx
                .send(Bytes::from_static(b"data: [DONE]\n\n"))
                .await
                .is_err()
        {
            control.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::new(ChunkBody { rx }))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A body of the chunks a task sends; it ends when the task drops its sender.
struct ChunkBody {
    rx: mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChunkBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}
