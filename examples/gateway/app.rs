//! The gateway: axum in front of an OpenAI-compatible provider, with the bulkhead layer on the
//! completions route, a JSON-body estimator in front of it, `/metrics` in Prometheus text and
//! an admin endpoint for limits snapshots (the kill switch). Used by `main.rs` and by the
//! HTTP integration tests.
#![allow(dead_code)]

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use llm_bulkhead::config::{BulkheadConfig, Format, LimitsConfig, LoadError};
use llm_bulkhead::llm::{LlmStats, Mode, TokenEstimator};
use llm_bulkhead::telemetry::{self, Telemetry};
use llm_bulkhead::tower::{
    count_http_refusal, estimate_json, openai_usage, BulkheadLayer, HeaderClassifier,
};
use llm_bulkhead::{ApplyLimitsError, Bulkhead, Subscription};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

/// The default configuration: two classes, a token budget, fail-fast.
pub const DEFAULT_CONFIG: &str = r#"{
  "max_concurrent": 8,
  "token_budget": { "budget": 60000, "high_priority_reserve": 4000, "output_cap": 1024 },
  "model": "gpt-4o",
  "admission_classes": {
    "default_class": "interactive",
    "classes": {
      "interactive": { "protected_concurrent": 4, "protected_tokens": 20000 },
      "batch": { "max_concurrent": 2, "max_tokens": 20000 }
    }
  }
}"#;

/// The largest request body the gateway reads to estimate tokens.
pub const MAX_BODY: usize = 1 << 20;

/// How long a client has, from the end of a request's head, to send its whole body (the
/// default of [`gateway`]).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The process-wide Prometheus recorder (the `metrics` facade has one global recorder).
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .expect("no other metrics recorder is installed in this process")
        })
        .clone()
}

/// Shared by the gateway's handlers.
pub struct Gateway {
    pub bulkhead: Bulkhead,
    pub name: String,
    estimator: Box<dyn TokenEstimator>,
    upstream: SocketAddr,
    prometheus: PrometheusHandle,
    body_read: Duration,
    _telemetry: Subscription,
}

/// Builds the gateway's router for `config`, forwarding to the provider at `upstream`.
/// `name` labels its metrics (one gateway per name in a process).
///
/// # Errors
/// An invalid configuration ([`LoadError`]).
pub fn gateway(
    config: &BulkheadConfig,
    upstream: SocketAddr,
    name: &str,
) -> Result<(Router, Arc<Gateway>), LoadError> {
    gateway_with(config, upstream, name, BODY_READ_TIMEOUT)
}

/// As [`gateway`], with `body_read` as the deadline for a request's body (from the end of its
/// head): a body still incomplete then is refused with a 408 and its connection closed.
///
/// # Errors
/// An invalid configuration ([`LoadError`]).
pub fn gateway_with(
    config: &BulkheadConfig,
    upstream: SocketAddr,
    name: &str,
    body_read: Duration,
) -> Result<(Router, Arc<Gateway>), LoadError> {
    let prometheus = prometheus();
    let bulkhead = config.build()?;
    let estimator = config.estimator().map_err(LoadError::Estimator)?;
    let telemetry = Telemetry::default().name(name).instrument(&bulkhead);
    let gw = Arc::new(Gateway {
        bulkhead: bulkhead.clone(),
        name: name.to_owned(),
        estimator: Box::new(estimator),
        upstream,
        prometheus,
        body_read,
        _telemetry: telemetry,
    });
    let classify = HeaderClassifier::new(&bulkhead)
        .class_header("x-traffic-class")
        .priority_header("x-priority")
        .require_estimate(true);
    let mut layer = BulkheadLayer::builder(bulkhead)
        .classifier(classify)
        .usage_from_frames(openai_usage)
        .record_metrics_named(name);
    // `"mode": "observe"` in the configuration: refused calls go through, counted as bypasses.
    match config.run_mode() {
        Ok(Mode::Observe(shadow)) => layer = layer.observe(shadow),
        Ok(_) => {}
        Err(e) => {
            return Err(LoadError::Parse {
                format: Format::Json,
                path: "shadow_reasons".into(),
                message: e.to_string(),
            })
        }
    }
    let layer = layer.build();
    // `route_layer`: only requests that match the route's method go through them (a GET gets
    // its 405 without an estimate or an admission).
    let completions = post(proxy)
        .route_layer(layer)
        // Outside the bulkhead: estimation reads the body before the decision.
        .route_layer(middleware::from_fn_with_state(gw.clone(), estimate));
    let router = Router::new()
        .route("/v1/chat/completions", completions)
        .route("/metrics", get(metrics))
        .route("/stats", get(stats))
        .route("/admin/limits", get(get_limits).post(post_limits))
        // Every request body, on every route, has its deadline.
        .layer(middleware::from_fn_with_state(gw.clone(), body_deadline))
        .with_state(gw.clone());
    Ok((router, gw))
}

/// An OpenAI-shaped error body (`type`, `code`, `message`).
fn error(status: StatusCode, kind: &str, code: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"type": kind, "code": code, "message": message.into()}});
    (status, Json(body)).into_response()
}

/// A refusal the gateway makes before the bulkhead layer (an unreadable body, a body that is
/// not a chat request): counted by status and code with the layer's own refusals.
fn refuse(gw: &Gateway, status: StatusCode, code: &'static str, message: String) -> Response {
    count_http_refusal(Some(&gw.name), status, code);
    let mut resp = error(status, "invalid_request", code, message);
    if status != StatusCode::BAD_REQUEST || code == "invalid_body" {
        // The body was not read to its end: the connection cannot carry another request.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Reads the JSON body (bounded), estimates its tokens and leaves the estimate in an extension
/// for the bulkhead layer's classifier.
async fn estimate(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    // A declared length over the bound is refused before a byte of the body is read, so a
    // client sending `Expect: 100-continue` gets its 413 instead of a 100 and then a reset.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return refuse(
            &gw,
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            too_large(),
        );
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            let (status, code, message) = body_error(e);
            return refuse(&gw, status, code, message);
        }
    };
    match estimate_json(&bytes, &*gw.estimator) {
        Ok(estimate) => {
            parts.extensions.insert(estimate);
        }
        Err(e) => return refuse(&gw, e.status, e.code, e.message),
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn too_large() -> String {
    format!("the request body must be at most {MAX_BODY} bytes")
}

/// Why a body could not be read: too long (413), too slow (408), or not a valid HTTP body
/// (400: a malformed chunked encoding, a connection cut mid-body).
fn body_error(e: axum::Error) -> (StatusCode, &'static str, String) {
    let e = e.into_inner();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", too_large());
        }
        if c.is::<BodyTimedOut>() {
            return (
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the request body did not arrive in time".into(),
            );
        }
        cause = c.source();
    }
    (
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "the request body is not a valid HTTP body".into(),
    )
}

/// Gives every request body its deadline ([`Gateway::body_read`], from now: the head is in).
async fn body_deadline(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let body = Body::new(Deadline {
        inner: body,
        sleep: Box::pin(tokio::time::sleep(gw.body_read)),
    });
    next.run(Request::from_parts(parts, body)).await
}

/// The error of a body whose deadline passed before its end.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimedOut {}

/// A request body that fails with [`BodyTimedOut`] once its deadline passes.
struct Deadline {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::BoxError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Forwards the request to the provider and streams its answer back.
async fn proxy(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            let (status, code, message) = body_error(e);
            return refuse(&gw, status, code, message);
        }
    };
    match forward(gw.upstream, parts.uri.path(), bytes).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_error",
            e.to_string(),
        ),
    }
}

async fn forward(
    upstream: SocketAddr,
    path: &str,
    body: Bytes,
) -> Result<http::Response<hyper::body::Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(upstream).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::post(path)
        .header(header::HOST, HeaderValue::from_static("127.0.0.1"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(body))?;
    Ok(sender.send_request(req).await?)
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    telemetry::record_gauges_named(&gw.bulkhead, &gw.name);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gw.prometheus.render(),
    )
        .into_response()
}

async fn stats(State(gw): State<Arc<Gateway>>) -> Response {
    // The bulkhead's figures and observe mode's (`observe`, when the layer observes).
    Json(LlmStats::of(&gw.bulkhead)).into_response()
}

async fn get_limits(State(gw): State<Arc<Gateway>>) -> Response {
    Json(LimitsConfig::of(&gw.bulkhead)).into_response()
}

/// Applies a limits snapshot (classes by name): 200 with the change, 409 for a stale revision,
/// 422 for an invalid snapshot. `max_concurrent: 0` is the kill switch.
async fn post_limits(State(gw): State<Arc<Gateway>>, body: Bytes) -> Response {
    let text = match std::str::from_utf8(&body) {
        Ok(t) => t,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "invalid_utf8",
                "not UTF-8",
            )
        }
    };
    let config = match LimitsConfig::from_json(text) {
        Ok(c) => c,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_limits",
                "invalid_limits",
                e.to_string(),
            )
        }
    };
    match config.apply(&gw.bulkhead) {
        Ok(change) => {
            let mut answer = json!({
                "applied": true,
                "previous_revision": change.previous.revision,
                "revision": change.current.revision,
            });
            // Legal, and logged as a warning by the telemetry: say it here too.
            if let Some(t) = change.current.token_budget {
                if t.high_priority_reserve > t.budget {
                    answer["warning"] = json!("the high-priority reserve exceeds the token budget: every normal-priority request is refused");
                }
            }
            Json(answer).into_response()
        }
        Err(LoadError::Apply(ApplyLimitsError::StaleRevision { current, .. })) => (
            StatusCode::CONFLICT,
            Json(json!({"applied": false, "reason": "stale_revision", "current_revision": current.revision})),
        )
            .into_response(),
        Err(e) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_limits",
            "invalid_limits",
            e.to_string(),
        ),
    }
}
