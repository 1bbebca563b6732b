//! The pools' events: one decision event per decision and one completion event per admitted
//! request, with the seed's sanitized fields, through `tracing` and `metrics`; and a request
//! whose prompt holds a marker string leaves no trace of it in any event, log line or metric.

use llm_bulkhead::llm::{LlmRequest, NaiveEstimator, TokenEstimator};
use llm_bulkhead::pools::*;
use llm_bulkhead::Priority;
use metrics_util::debugging::DebuggingRecorder;
use std::sync::{Arc, Mutex};

#[path = "support/log_buffer.rs"]
mod log_buffer;
use log_buffer::Buffer;

/// Keeps every event as JSON, and counts them.
#[derive(Clone, Default)]
struct Keep(Arc<Mutex<(Vec<String>, usize, usize)>>);

impl PoolsObserver for Keep {
    fn on_decision(&self, e: &DecisionEvent<'_>) {
        let mut g = self.0.lock().unwrap();
        g.0.push(serde_json::to_string(e).unwrap());
        g.1 += 1;
    }
    fn on_completion(&self, e: &CompletionEvent<'_>) {
        let mut g = self.0.lock().unwrap();
        g.0.push(serde_json::to_string(e).unwrap());
        g.2 += 1;
    }
}

const MARKER: &str = "SECRET-PROMPT-MARKER-7f3a";

fn config() -> PoolsConfig {
    let mut c = PoolsConfig::single("primary", "interactive", 1);
    c.extend_with("secondary", "interactive", 1);
    c.classes.get_mut("interactive").unwrap().overflow = Overflow::Fallback;
    let p = c.partitions.get_mut("primary-interactive").unwrap();
    p.fallback = vec!["secondary-interactive".into()];
    p.token_budget = Some(100_000);
    c
}

#[test]
fn events_are_one_per_decision_and_completion_and_never_carry_the_prompt() {
    let log = Buffer::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let keep = Keep::default();
    let mut decisions = 0;
    let mut admitted = 0;
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            let pools = Pools::with_observer(
                &config(),
                (keep.clone(), (TracingObserver, MetricsObserver)),
            )
            .unwrap();
            // The gateway's request, prompt and all: only the classification and the
            // estimate reach the pools.
            let request = LlmRequest::new("gpt-4o", &[MARKER]);
            let tokens = NaiveEstimator.estimate(&request).unwrap().total();
            let id = pools
                .classify(&Classification::new("primary", "interactive"))
                .unwrap();
            let mut held = Vec::new();
            for n in 0..3u64 {
                let mut req = PoolRequest::new(40 + n, id);
                req.tokens = tokens;
                req.priority = Priority::High;
                let out = pools.admit(&req);
                decisions += out.route().attempts() as usize;
                if let Some(p) = out.into_permit() {
                    admitted += 1;
                    held.push(p);
                }
            }
            // A charge and a refused charge: one decision each.
            let c = pools.charge_retry(50, id).unwrap();
            decisions += 1;
            drop(c);
            held.pop()
                .unwrap()
                .complete(Some(FailureClass::UpstreamOverload));
            drop(held);
            pools.record_gauges();
        });
    });
    let (events, d, c) = keep.0.lock().unwrap().clone();
    assert_eq!((d, c), (decisions, admitted));
    // Dispatch; fallback and dispatch; fallback and a rejection (the secondary has no
    // fallback of its own); the retry charge.
    assert_eq!((decisions, admitted), (6, 2));
    let first: serde_json::Value = serde_json::from_str(&events[0]).unwrap();
    for field in [
        "request_id",
        "provider",
        "partition",
        "traffic_class",
        "priority",
        "active",
        "active_limit",
        "pending",
        "pending_limit",
        "retry_count",
        "retry_limit",
        "decision",
        "reason",
        "fallback_partition",
        "limit_version",
    ] {
        assert!(first.get(field).is_some(), "{field} missing in {first}");
    }
    let fallback = events.iter().find(|e| e.contains("\"fallback\"")).unwrap();
    assert!(
        fallback.contains("\"fallback_partition\":\"secondary-interactive\""),
        "{fallback}"
    );
    assert!(events
        .iter()
        .any(|e| e.contains("\"failure_class\":\"upstream_overload\"")));
    assert!(events
        .iter()
        .any(|e| e.contains("\"failure_class\":\"dropped\"")));

    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        text.matches("bulkhead_decision").count(),
        decisions,
        "{text}"
    );
    assert_eq!(
        text.matches("bulkhead_completion").count(),
        admitted,
        "{text}"
    );
    let metrics: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| format!("{:?} {v:?}", k.key()))
        .collect();
    assert!(metrics
        .iter()
        .any(|m| m.contains("llm_bulkhead_pool_decisions_total")));
    assert!(metrics
        .iter()
        .any(|m| m.contains("llm_bulkhead_pool_active")));
    // The marker is nowhere.
    for e in &events {
        assert!(!e.contains(MARKER), "{e}");
    }
    assert!(!text.contains(MARKER));
    assert!(metrics.iter().all(|m| !m.contains(MARKER)));
}
