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
use llm_bulkhead::tower::{estimate_json, openai_usage, BulkheadLayer, HeaderClassifier};
use llm_bulkhead::{ApplyLimitsError, Bulkhead, Subscription};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

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

/// The process-wide Prometheus recorder (the `metrics` facade has one global recorder).
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Buckets: the layer's hold-time and queue-wait figures render as histograms
            // (aggregatable across replicas), not as summaries.
            PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(telemetry::HOLD_SECONDS.into()),
                    &telemetry::HOLD_SECONDS_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(telemetry::QUEUE_WAIT_SECONDS.into()),
                        &telemetry::QUEUE_WAIT_SECONDS_BUCKETS,
                    )
                })
                .expect("non-empty buckets")
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
    telemetry: Telemetry,
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
    let prometheus = prometheus();
    let bulkhead = config.build()?;
    let estimator = config.estimator().map_err(LoadError::Estimator)?;
    let telemetry = Telemetry::default().name(name);
    let subscription = telemetry.instrument(&bulkhead);
    let gw = Arc::new(Gateway {
        bulkhead: bulkhead.clone(),
        name: name.to_owned(),
        estimator: Box::new(estimator),
        upstream,
        prometheus,
        telemetry,
        _telemetry: subscription,
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
        .with_state(gw.clone());
    Ok((router, gw))
}

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"type": kind, "message": message.into()}});
    (status, Json(body)).into_response()
}

/// Reads the JSON body (bounded), estimates its tokens and leaves the estimate in an extension
/// for the bulkhead layer's classifier.
async fn estimate(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                format!("the request body must be valid and at most {MAX_BODY} bytes"),
            )
        }
    };
    match estimate_json(&bytes, &*gw.estimator) {
        Ok(estimate) => {
            parts.extensions.insert(estimate);
        }
        Err(e) => return error(e.status, e.code, e.message),
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Forwards the request to the provider and streams its answer back.
async fn proxy(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
    };
    match forward(gw.upstream, parts.uri.path(), bytes).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => error(StatusCode::BAD_GATEWAY, "upstream_error", e.to_string()),
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
    // Counters and gauges from one `stats()` read: nothing is pushed per decision.
    gw.telemetry.record(&gw.bulkhead);
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
        Err(_) => return error(StatusCode::BAD_REQUEST, "invalid_request", "not UTF-8"),
    };
    let config = match LimitsConfig::from_json(text) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_limits", e.to_string()),
    };
    match config.apply(&gw.bulkhead) {
        Ok(change) => Json(json!({
            "applied": true,
            "previous_revision": change.previous.revision,
            "revision": change.current.revision,
        }))
        .into_response(),
        Err(LoadError::Apply(ApplyLimitsError::StaleRevision { current, .. })) => (
            StatusCode::CONFLICT,
            Json(json!({"applied": false, "reason": "stale_revision", "current_revision": current.revision})),
        )
            .into_response(),
        Err(e) => error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_limits", e.to_string()),
    }
}
